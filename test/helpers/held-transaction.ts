/** A transaction a test holds open, as another session would: its locks held until it lets go. */
import type { Sql, TxSql } from '../../src/db.ts'

/**
 * Runs `lock` in a transaction on `sql` and keeps the transaction open, its locks held, until the
 * function returned is called (which resolves once the transaction has ended). Resolves once `lock`
 * is done, not when the backend first looks idle in its transaction; a `lock` that fails rejects.
 */
export async function holdOpen(sql: Sql, lock: (tx: TxSql) => Promise<unknown>): Promise<() => Promise<void>> {
  let release!: () => void
  const released = new Promise<void>(resolve => (release = resolve))
  let held!: () => void
  const holding = new Promise<void>(resolve => (held = resolve))
  const done = sql.begin(async tx => {
    await lock(tx)
    held()
    await released
  })
  await Promise.race([holding, done])
  return async () => {
    release()
    await done
  }
}
