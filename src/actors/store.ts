/** SQL for the runtime's records: fences (one holder, a monotonic clock) and applied commands (exactly once). */
import type { Db, Sql } from '../db.ts'

/**
 * Checks the holder's fencing token inside the command's transaction and locks the actor's row
 * until commit. Returns the time to apply the command at (never before the actor's last), or null
 * when a newer holder has taken over (`newest` is its token).
 */
export async function enterFence(
  sql: Db,
  actor: string,
  token: number,
  now: Date,
): Promise<{ at: Date } | { newest: number }> {
  const [row] = await sql<{ at: Date }[]>`
    insert into actor_fences (actor, token, last_at) values (${actor}, ${token}, ${now})
    on conflict (actor) do update
      set token = excluded.token,
          last_at = greatest(excluded.last_at, actor_fences.last_at + interval '1 millisecond')
      where actor_fences.token <= excluded.token
    returning last_at as at
  `
  if (row) return { at: row.at }
  const [current] = await sql<{ token: number }[]>`select token from actor_fences where actor = ${actor}`
  return { newest: current?.token ?? token }
}

/** Claims a command for this transaction; false when it was applied before. */
export async function claimCommand(
  sql: Db,
  command: { actor: string; commandId: string; entryId: string; requestHash: Buffer | null; at: Date },
): Promise<boolean> {
  const rows = await sql`
    insert into actor_applied (actor, command_id, entry_id, request_hash, result, applied_at)
    values (${command.actor}, ${command.commandId}, ${command.entryId}, ${command.requestHash}, 'null', ${command.at})
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
): Promise<{ entryId: string; requestHash: Buffer | null; result: unknown } | undefined> {
  const [row] = await sql<{ entryId: string; requestHash: Buffer | null; result: unknown }[]>`
    select entry_id as "entryId", request_hash as "requestHash", result from actor_applied
    where actor = ${actor} and command_id = ${commandId}
  `
  return row
}

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
