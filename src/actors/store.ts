/** The record of applied commands (exactly once in effect), kept as long as a repeat can reach it. */
import { deleteOlderThan, type Sql } from '../db.ts'

/** How long applied commands are remembered: twice the Idempotency-Key window, so a retried command still finds its first result. */
export const appliedCommandsKeptMs = 2 * 86_400_000

/** Forgets applied commands older than any redelivery or Idempotency-Key replay can reach, in batches. */
export function purgeAppliedCommands(sql: Sql, olderThan: Date): Promise<number> {
  return deleteOlderThan(sql, 'actor_applied', 'applied_at', olderThan)
}
