/** SQL for the record of applied commands (exactly once in effect), kept as long as a repeat can reach it. */
import type { Sql } from '../db.ts'

/** Forgets applied commands older than any redelivery or Idempotency-Key replay can reach, in batches. */
export async function purgeAppliedCommands(sql: Sql, olderThan: Date): Promise<number> {
  let total = 0
  for (;;) {
    const [row] = await sql<{ n: number }[]>`
      with gone as (
        delete from actor_applied
        where ctid in (select ctid from actor_applied where applied_at < ${olderThan} limit 5000)
        returning 1
      )
      select count(*)::int as n from gone
    `
    total += row!.n
    if (row!.n < 5000) return total
  }
}
