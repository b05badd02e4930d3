/** SQL for the record of applied actor commands. */
import type { Db, Sql } from '../db.ts'

/** Claims a command for this transaction; false when it was applied before. */
export async function claimCommand(
  sql: Db,
  command: { actor: string; commandId: string; requestHash: Buffer | null; at: Date },
): Promise<boolean> {
  const rows = await sql`
    insert into actor_applied (actor, command_id, request_hash, result, applied_at)
    values (${command.actor}, ${command.commandId}, ${command.requestHash}, 'null', ${command.at})
    on conflict (actor, command_id) do nothing
    returning 1
  `
  return rows.length === 1
}

export async function recordResult(sql: Db, actor: string, commandId: string, result: unknown): Promise<void> {
  await sql`
    update actor_applied set result = ${sql.json(result as never)}
    where actor = ${actor} and command_id = ${commandId}
  `
}

export async function appliedCommand(
  sql: Db,
  actor: string,
  commandId: string,
): Promise<{ requestHash: Buffer | null; result: unknown } | undefined> {
  const [row] = await sql<{ requestHash: Buffer | null; result: unknown }[]>`
    select request_hash as "requestHash", result from actor_applied
    where actor = ${actor} and command_id = ${commandId}
  `
  return row
}

/** Forgets applied commands older than any redelivery or Idempotency-Key replay can reach. */
export async function purgeAppliedCommands(sql: Sql, olderThan: Date): Promise<number> {
  const rows = await sql`delete from actor_applied where applied_at < ${olderThan} returning 1`
  return rows.length
}
