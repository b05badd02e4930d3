/** The record of applied commands (exactly once in effect), kept as long as a repeat can reach it. */
import { deleteOlderThan, type Sql } from '../db.ts'

/** Forgets applied commands older than any redelivery or Idempotency-Key replay can reach, in batches. */
export function purgeAppliedCommands(sql: Sql, olderThan: Date): Promise<number> {
  return deleteOlderThan(sql, 'actor_applied', 'applied_at', olderThan)
}
