/** Proxy calls in tests: a metered subscriber with a connection, and waiting for the metering worker. */
import { createAgent, signUp, type TestAgent, type TestContext, type TestUser } from './context.ts'

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

export interface MeteredSubscriber {
  agent: TestAgent
  user: TestUser
  planId: string
  subscriptionId: string
}

/**
 * A new agent of `owner` with a metered plan (`terms` override its prices), a new user subscribed to
 * it, and that user's connection `provider` to `upstreamUrl`/api: what a proxy call needs.
 */
export async function meteredSubscriber(
  ctx: TestContext,
  owner: TestUser,
  upstreamUrl: string,
  terms: Record<string, number> = {},
  provider = 'acme',
): Promise<MeteredSubscriber> {
  const agent = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'Metered', monthlyPriceCents: 1000, includedProxyCalls: 3, overagePerCallCents: 10, ...terms },
  })
  const user = await signUp(ctx)
  const sub = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
  const connection = await ctx.call('POST', '/v1/connections', {
    token: user.token,
    body: { provider, baseUrl: `${upstreamUrl}/api`, credential: 'upstream-secret-token', label: 'Acme' },
  })
  if (connection.status !== 201) throw new Error(JSON.stringify(connection.body))
  return { agent, user, planId: plan.body.data.id, subscriptionId: sub.body.data.id }
}
