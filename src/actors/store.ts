/** The record of applied commands (exactly once in effect), kept as long as a repeat can reach it. */
import { deleteOlderThan, type Sql } from '../db.ts'

/** How long applied commands are remembered: twice the Idempotency-Key window, so a retried command still finds its first result. */
export const appliedCommandsKeptMs = 2 * 86_400_000

/** Forgets applied commands older than any redelivery or Idempotency-Key replay can reach, in batches. */
export function purgeAppliedCommands(sql: Sql, olderThan: Date): Promise<number> {
  return deleteOlderThan(sql, 'actor_applied', 'applied_at', olderThan)
}

/**
 * Moves the actor's fence in Postgres to `token` (unless a newer one is there), for a holder that
 * applies no commands itself (an inbox rebuild): a holder paused past its lease then commits nothing
 * more, and a transaction of its already applying commands is waited for (its fence row is locked to
 * its commit), so what the caller reads after this includes it. `last_at` is left as it is. Returns
 * the fence's token: a newer one than `token` (Redis lost its counter) fenced nothing out.
 */
export async function fenceOut(sql: Sql, actor: string, token: number): Promise<number> {
  const [row] = await sql<{ token: string }[]>`
    insert into actor_fences (actor, token, last_at) values (${actor}, ${token}, '-infinity')
    on conflict (actor) do update set token = greatest(actor_fences.token, excluded.token)
    returning token
  `
  return Number(row!.token)
}
