/**
 * An actor turn, after the hold: the held actors' commands applied in one Postgres transaction (each
 * actor's in order, the actors side by side), then each actor's projections in order. The runtime
 * runs it on the mail it claimed (work.ts); the careful retry of a failed batch is the same turn with
 * one command.
 */
import type { Sql, TxSql } from '../db.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log, type Throttled } from '../log.ts'
import { isRefusal, type ActorKinds, type CommandContext, type CommandHandler } from './types.ts'

export interface BatchCommand {
  commandId: string
  /** The mailbox entry that carried it; a redelivery of that same entry projects it again. */
  entryId: string
  type: string
  payload(): unknown
  /** Hex fingerprint of the request behind a sender-chosen id, to refuse the id reused with another. */
  requestHash: string | null
  /** Could have been applied before: a redelivery, or an id the sender chose (an Idempotency-Key). */
  mayRepeat: boolean
}

export interface BatchActor {
  actor: string
  kind: string
  /** The fencing token of the hold this batch applies under. */
  token: number
  commands: BatchCommand[]
}

export interface Applied {
  handler: CommandHandler | undefined
  result: unknown
  /** False for a repeat from another entry: projecting it again could undo newer state. */
  project: boolean
  context: CommandContext
  payload: unknown
}

/** A batch's transaction failed; `actor`'s command failed first. */
export class BatchFailed extends Error {
  constructor(
    readonly actor: string,
    override readonly cause: unknown,
  ) {
    super(`a command of ${actor} failed: ${(cause as Error)?.message ?? cause}`)
  }
}

export interface TurnDeps {
  sql: Sql
  clock: Clock
  kinds: ActorKinds
  log: Log
  /** What repeats while Redis or Postgres is away (a projection failing for every actor), said once a minute. */
  outage: Throttled
  leaseMs: number
}

export interface TurnOutcome {
  /** Each actor's commands in order, for the actors whose fence held. */
  applied: Map<string, Applied[]>
  /** Actors a newer holder fenced out, with the newest token Postgres has seen. */
  fenced: Map<string, number>
  /** How many of each actor's commands were projected (or needed none); the rest were given up. */
  projected: Map<string, number>
}

/**
 * The turn: the batch's transaction (throws `BatchFailed`, having changed nothing, if a command
 * fails), then each actor's projections in order while it is held.
 */
export async function applyTurn(deps: TurnDeps, actors: BatchActor[], held: (actor: string) => boolean): Promise<TurnOutcome> {
  const { applied, fenced } = await applyBatch(deps, actors)
  const projected = new Map<string, number>()
  await Promise.all([...applied].map(async ([actor, list]) => projected.set(actor, await project(deps, list, () => held(actor)))))
  return { applied, fenced, projected }
}

type Seen = { entryId: string; requestHash: string | null; result: unknown }

/**
 * One transaction for the batch: fences every actor, then applies each actor's commands in order, the
 * actors' chains side by side (their statements pipelined on the one connection), and records them
 * as applied in one statement. Throws `BatchFailed`, having changed nothing, if any command fails.
 */
async function applyBatch({ sql, clock, kinds }: TurnDeps, actors: BatchActor[]) {
  // One order for every batch, so two batches' fence upserts never wait on each other in a cycle.
  const held = [...actors].sort((a, b) => (a.actor < b.actor ? -1 : a.actor > b.actor ? 1 : 0))
  return sql.begin(async tx => {
    const now = clock.now()
    const [lastAt, seen] = await Promise.all([fence(tx, held, now), findApplied(tx, held)])
    const applied = new Map<string, Applied[]>()
    const fresh: AppliedRecord[] = []
    let culprit: { actor: string; error: unknown } | undefined
    const chain = async (h: BatchActor) => {
      const list: Applied[] = []
      applied.set(h.actor, list)
      // The latest time the actor's commands took so far: each next one is given a later one.
      let latest = -Infinity
      const passed = (time: Date) => void (latest = Math.max(latest, time.getTime()))
      for (const [i, command] of h.commands.entries()) {
        const key = `${h.actor}\n${command.commandId}`
        const at = new Date(Math.max(lastAt.get(h.actor)! - (h.commands.length - 1 - i), latest + 1))
        passed(at)
        const context: CommandContext = { actor: h.actor, id: h.actor.slice(h.kind.length + 1), commandId: command.commandId, at, passed }
        try {
          const handler = kinds[h.kind]?.[command.type]
          if (!handler) throw new Error(`no handler for ${h.kind} command ${command.type}`)
          const payload = command.payload()
          const before = seen.get(key)
          if (before) {
            list.push({ handler, context, payload, ...repeatOf(before, command) })
            continue
          }
          const result = await handler.apply(tx, payload, context)
          seen.set(key, { entryId: command.entryId, requestHash: command.requestHash, result })
          fresh.push({ actor: h.actor, commandId: command.commandId, entryId: command.entryId, requestHash: command.requestHash, result, at })
          list.push({ handler, result, project: true, context, payload })
        } catch (error) {
          // The first to fail is the culprit; the others fail after it (the transaction is aborted).
          culprit ??= { actor: h.actor, error }
          throw error
        }
      }
      // Past the fence's time: the actor's next batch begins after it.
      if (latest > lastAt.get(h.actor)!) await moveFenceOn(tx, h.actor, new Date(latest))
    }
    await Promise.allSettled(held.filter(h => lastAt.has(h.actor)).map(chain))
    if (culprit) throw new BatchFailed(culprit.actor, culprit.error)
    if (fresh.length > 0) await recordApplied(tx, fresh)
    return { applied, fenced: await fencedOut(tx, held, lastAt) }
  })
}

/**
 * Moves each actor's fence to its token, unless a newer holder's is there; the actors fenced in, with
 * the time of their last command. Each actor's clock moves past its last command: its n commands here
 * get n successive milliseconds.
 */
async function fence(tx: TxSql, held: BatchActor[], now: Date): Promise<Map<string, number>> {
  const rows = await tx<{ actor: string; at: Date }[]>`
    insert into actor_fences (actor, token, last_at)
    select actor, token, ${now}::timestamptz + (n - 1) * interval '1 millisecond'
    from unnest(${held.map(h => h.actor)}::text[], ${held.map(h => h.token)}::bigint[], ${held.map(h => h.commands.length)}::int[]) as w(actor, token, n)
    on conflict (actor) do update
      set token = excluded.token,
          last_at = greatest(excluded.last_at, actor_fences.last_at + (excluded.last_at - ${now}::timestamptz) + interval '1 millisecond')
      where actor_fences.token <= excluded.token
    returning actor, last_at as at
  `
  return new Map(rows.map(row => [row.actor, row.at.getTime()]))
}

/** Moves the actor's clock on to `at` (a command's effect took that time): its next batch begins after it. */
async function moveFenceOn(tx: TxSql, actor: string, at: Date) {
  await tx`update actor_fences set last_at = ${at} where actor = ${actor} and last_at < ${at}`
}

/** The actors a newer holder fenced out, with the token Postgres has seen. */
async function fencedOut(tx: TxSql, held: BatchActor[], lastAt: Map<string, number>): Promise<Map<string, number>> {
  const outdated = held.filter(h => !lastAt.has(h.actor)).map(h => h.actor)
  if (outdated.length === 0) return new Map()
  const rows = await tx<{ actor: string; token: number }[]>`select actor, token from actor_fences where actor = any(${outdated}::text[])`
  return new Map(rows.map(row => [row.actor, Number(row.token)]))
}

/**
 * What the commands that may repeat (a redelivery, an id the sender chose) left when applied before;
 * a fresh random id cannot have been, and should one ever repeat, the primary key refuses it.
 */
async function findApplied(tx: TxSql, held: BatchActor[]): Promise<Map<string, Seen>> {
  const repeatable = held.flatMap(h => h.commands.filter(c => c.mayRepeat).map(c => [h.actor, c.commandId] as const))
  if (repeatable.length === 0) return new Map()
  // One index probe per command (the lateral limit keeps the planner from a hash join over the table).
  const rows = await tx<({ actor: string; commandId: string } & Seen)[]>`
    select c.actor, c.command_id as "commandId", a.entry_id as "entryId", encode(a.request_hash, 'hex') as "requestHash", a.result
    from unnest(${repeatable.map(c => c[0])}::text[], ${repeatable.map(c => c[1])}::text[]) as c(actor, command_id)
    cross join lateral (
      select entry_id, request_hash, result from actor_applied
      where actor = c.actor and command_id = c.command_id
      limit 1
    ) as a
  `
  return new Map(rows.map(row => [`${row.actor}\n${row.commandId}`, row]))
}

interface AppliedRecord {
  actor: string
  commandId: string
  entryId: string
  requestHash: string | null
  result: unknown
  at: Date
}

/**
 * Records a batch's new commands as applied, with their results: one statement. A command applied
 * before under the same id but read as new (appended twice, by a call sent again after its reply was
 * lost) fails the batch here; read again by the next holder, as a redelivery, it is found.
 */
async function recordApplied(tx: TxSql, rows: AppliedRecord[]) {
  await tx`
    insert into actor_applied (actor, command_id, entry_id, request_hash, result, applied_at)
    select r.actor, r."commandId", r."entryId", decode(r."requestHash", 'hex'), coalesce(r.result, 'null'::jsonb), r.at
    from jsonb_to_recordset(${JSON.stringify(rows.map(row => ({ ...row, result: row.result ?? null })))}::text::jsonb)
      as r(actor text, "commandId" text, "entryId" text, "requestHash" text, result jsonb, at timestamptz)
  `
}

/**
 * The answer to a command id applied before: refused if the id came with another request; else the
 * first result, projected again only for the same entry (its holder died before acknowledging it).
 * Another entry with an old id is a repeat sent later; projecting it would undo newer state.
 */
function repeatOf(previous: Seen, command: BatchCommand) {
  const reused = command.requestHash !== null && previous.requestHash !== null && previous.requestHash !== command.requestHash
  if (reused) return { result: { refused: 'idempotency_key_reused' } as unknown, project: false }
  return { result: previous.result ?? null, project: previous.entryId === command.entryId }
}

// A projection that fails is tried this often (backing off) before it is given up.
const projectionAttempts = 5

/**
 * One actor's projections in order; how many were made (or needed none). One that fails (Redis away)
 * is tried again, so no later one overtakes it; given up (still failing, the hold lost or the process
 * closing), it and the ones after it are left to whoever holds the actor next.
 */
async function project(deps: TurnDeps, applied: Applied[], held: () => boolean): Promise<number> {
  let i = 0
  for (let attempt = 1; ; attempt++) {
    try {
      for (; i < applied.length; i++) {
        const command = applied[i]!
        if (due(command)) await command.handler!.project!(command.result, command.payload, command.context)
      }
      return i
    } catch (error) {
      const actor = applied[i]!.context.actor
      const fields = errorFields(error)
      deps.outage('warn', `projection:${String(fields.code ?? fields.error)}`, 'actor projection failed', { actor, attempt, ...fields })
      if (attempt < projectionAttempts && held()) {
        await Bun.sleep(Math.min(100 * 2 ** (attempt - 1), deps.leaseMs / 4))
        if (held()) continue
      }
      return i
    }
  }
}

/** Whether a command's projection is to be made. */
export const due = (command: Applied) => command.project && !isRefusal(command.result) && command.handler?.project !== undefined
