/** Waiting for the metering worker in tests. */
import type { TestContext } from './context.ts'

/** The calls counted into a subscription's periods, once they reach `expected` (or after 15 s, whatever they are). */
export async function counted(ctx: TestContext, subscriptionId: string, expected: number): Promise<number> {
  const deadline = Date.now() + 15_000
  for (;;) {
    const [row] = await ctx.deps.sql<{ n: number }[]>`
      select coalesce(sum(proxy_calls), 0)::int as n from subscription_periods where subscription_id = ${subscriptionId}
    `
    if (row!.n === expected || Date.now() > deadline) return row!.n
    await Bun.sleep(25)
  }
}
