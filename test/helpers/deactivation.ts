/** An agent's deactivation held open in tests, to race a request against it. */
import type { Sql, TxSql } from '../../src/db.ts'
import { deactivateAgent } from '../../src/participants/deactivate.ts'
import { until } from './until.ts'

export interface HeldDeactivation {
  /** Waits until a statement of the database waits for a lock (the request's, on a row held here), then commits. */
  commitOnceWaited(): Promise<void>
}

/** Until a statement of the database `sql` reaches waits for a lock. */
export const lockWaited = (sql: Sql, ms = 5000) =>
  until(async () => (await sql`select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`).length > 0, ms)

/**
 * The agent's deactivation as DELETE /v1/participants/{id} makes it (its row locked for update, then
 * deactivated), and `alsoLock`'s rows, held open before the commit; resolves once all are held.
 */
export async function holdDeactivation(
  sql: Sql,
  agent: { id: string; ownerId: string },
  alsoLock: (tx: TxSql) => Promise<unknown> = async () => {},
): Promise<HeldDeactivation> {
  let release!: () => void
  const released = new Promise<void>(resolve => (release = resolve))
  let held!: () => void
  const holding = new Promise<void>(resolve => (held = resolve))
  const committed = sql.begin(async tx => {
    await tx`select 1 from participants where id = ${agent.id} for update`
    await alsoLock(tx)
    await deactivateAgent(tx, agent.id, agent.ownerId, new Date())
    held()
    await released
  })
  // A failure before the hold (a lock not had) fails the caller's wait rather than hanging it.
  await Promise.race([holding, committed.then(() => Promise.reject(new Error('the deactivation committed before it was held')))])
  return {
    async commitOnceWaited() {
      try {
        await lockWaited(sql)
      } finally {
        release()
        await committed
      }
    },
  }
}
