/**
 * An actor turn, after the hold: the held actors' commands applied in one Postgres transaction (each
 * actor's in order, the actors side by side), then each actor's projections in order. The runtime
 * runs it on the mail it reads (mail.ts), a sender on the commands of actors it found idle
 * (inline.ts); the careful retry of a failed batch is the same turn with one command.
 */
import type { Sql, TxSql } from '../db.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log } from '../log.ts'
import { isRefusal, type ActorKinds, type CommandContext, type CommandHandler } from './types.ts'
import type { Repairs } from './repairs.ts'

export interface BatchCommand {
  commandId: string
  /** The mailbox entry that carried it; a redelivery of that same entry may project it again. */
  entryId: string
  type: string
  payload(): unknown
  /** Hex fingerprint of the request behind a sender-chosen id, to refuse the id reused with another. */
  requestHash: string | null
  /** Could have been applied before: a redelivery, or an id the sender chose (an Idempotency-Key). */
  mayRepeat: boolean
  /** Recorded as applied, for redeliveries and repeats to find (a command no one can repeat needs no record). */
  record: boolean
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
  /** False for a repeat: its effect and projection happened when it was first applied. */
  project: boolean
  context: CommandContext
  payload: unknown
}

export interface BatchOutcome {
  /** Each actor's commands in order, for the actors whose fence held. */
  applied: Map<string, Applied[]>
  /** Actors a newer holder fenced out, with the newest token Postgres has seen. */
  fenced: Map<string, number>
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

/**
 * One transaction for the batch: fences every actor, then applies each actor's commands in order, the
 * actors side by side (their statements pipelined on the one connection), and records them as
 * applied in one statement. Throws `BatchFailed`, having changed nothing, if any command fails.
 */
async function applyBatch(sql: Sql, clock: Clock, kinds: ActorKinds, actors: BatchActor[]): Promise<BatchOutcome> {
  // One order for every batch, so two batches' fence upserts never wait on each other in a cycle.
  const held = [...actors].sort((a, b) => (a.actor < b.actor ? -1 : a.actor > b.actor ? 1 : 0))
  return sql.begin(async tx => {
    const now = clock.now()
    // Only a redelivery or a command whose id the sender chose can have been applied before; a fresh
    // random id cannot, and should one ever repeat, the primary key refuses it.
    const repeatable = held.flatMap(h => h.commands.filter(c => c.mayRepeat).map(c => [h.actor, c.commandId] as const))
    const [fences, previous] = await Promise.all([
      // Each actor's clock moves past its last command; its n commands here get n successive milliseconds.
      tx<{ actor: string; at: Date }[]>`
        insert into actor_fences (actor, token, last_at)
        select actor, token, ${now}::timestamptz + (n - 1) * interval '1 millisecond'
        from unnest(${held.map(h => h.actor)}::text[], ${held.map(h => h.token)}::bigint[], ${held.map(h => h.commands.length)}::int[]) as w(actor, token, n)
        on conflict (actor) do update
          set token = excluded.token,
              last_at = greatest(excluded.last_at, actor_fences.last_at + (excluded.last_at - ${now}::timestamptz) + interval '1 millisecond')
          where actor_fences.token <= excluded.token
        returning actor, last_at as at
      `,
      repeatable.length === 0
        ? []
        : // One index probe per command (the lateral limit keeps the planner from a hash join over the table).
          tx<{ actor: string; commandId: string; entryId: string; requestHash: string | null; result: unknown }[]>`
            select c.actor, c.command_id as "commandId", a.entry_id as "entryId", encode(a.request_hash, 'hex') as "requestHash", a.result
            from unnest(${repeatable.map(c => c[0])}::text[], ${repeatable.map(c => c[1])}::text[]) as c(actor, command_id)
            cross join lateral (
              select entry_id, request_hash, result from actor_applied
              where actor = c.actor and command_id = c.command_id
              limit 1
            ) as a
          `,
    ])
    const lastAt = new Map(fences.map(row => [row.actor, row.at.getTime()]))
    const seen = new Map<string, { entryId: string; requestHash: string | null; result: unknown }>()
    for (const row of previous) seen.set(`${row.actor}\n${row.commandId}`, row)

    const fresh: AppliedRecord[] = []
    const applied = new Map<string, Applied[]>()
    const fencedIn = held.filter(h => lastAt.has(h.actor))
    for (const h of fencedIn) applied.set(h.actor, [])
    const waves = Math.max(0, ...fencedIn.map(h => h.commands.length))
    // Wave i holds the i-th command of every actor that has one: each actor's commands apply in order.
    for (let i = 0; i < waves; i++) {
      const steps: Step[] = []
      for (const h of fencedIn) {
        const command = h.commands[i]
        if (!command) continue
        const list = applied.get(h.actor)!
        const handler = kinds[h.kind]?.[command.type]
        let payload: unknown
        try {
          if (!handler) throw new Error(`no handler for ${h.kind} command ${command.type}`)
          payload = command.payload()
        } catch (error) {
          throw new BatchFailed(h.actor, error)
        }
        const { commandId, entryId, requestHash } = command
        const at = new Date(lastAt.get(h.actor)! - (h.commands.length - 1 - i))
        const context: CommandContext = { actor: h.actor, id: h.actor.slice(h.kind.length + 1), commandId, at }
        const before = seen.get(`${h.actor}\n${commandId}`)
        if (before) {
          const reused = requestHash !== null && before.requestHash !== null && before.requestHash !== requestHash
          list.push({ handler, context, payload, ...repeatOf(before, entryId, reused) })
        } else {
          steps.push({ actor: h.actor, command, handler, payload, context, result: undefined })
        }
      }
      await applySteps(tx, steps)
      for (const step of steps) {
        const { actor, command, handler, payload, context, result } = step
        seen.set(`${actor}\n${command.commandId}`, { entryId: command.entryId, requestHash: command.requestHash, result })
        if (command.record) {
          fresh.push({
            actor,
            commandId: command.commandId,
            entryId: command.entryId,
            requestHash: command.requestHash,
            result: result ?? null,
            at: context.at,
          })
        }
        applied.get(actor)!.push({ handler, result, project: true, context, payload })
      }
    }
    if (fresh.length > 0) await recordApplied(tx, fresh)

    const fenced = new Map<string, number>()
    const outdated = held.filter(h => !lastAt.has(h.actor)).map(h => h.actor)
    if (outdated.length > 0) {
      const rows = await tx<{ actor: string; token: number }[]>`
        select actor, token from actor_fences where actor = any(${outdated}::text[])
      `
      for (const row of rows) fenced.set(row.actor, Number(row.token))
    }
    return { applied, fenced }
  })
}

interface Step {
  actor: string
  command: BatchCommand
  handler: CommandHandler
  payload: unknown
  context: CommandContext
  result: unknown
}

/**
 * Applies one wave's commands, all at once on the transaction's connection (their statements are
 * pipelined). Throws `BatchFailed` naming the actor whose command failed first.
 */
async function applySteps(tx: TxSql, steps: Step[]) {
  let failed: string | undefined
  const calls = steps.map(step =>
    step.handler.apply(tx, step.payload, step.context).then(
      result => void (step.result = result),
      error => {
        // The first to fail is the culprit; the others fail after it (the transaction is aborted).
        failed ??= step.actor
        throw error
      },
    ),
  )
  const rejected = (await Promise.allSettled(calls)).find(s => s.status === 'rejected')
  if (rejected) throw new BatchFailed(failed!, (rejected as PromiseRejectedResult).reason)
}

interface AppliedRecord {
  actor: string
  commandId: string
  entryId: string
  requestHash: string | null
  result: unknown
  at: Date
}

/** Records a batch's new commands as applied, with their results: one statement. */
async function recordApplied(tx: TxSql, rows: AppliedRecord[]) {
  await tx`
    insert into actor_applied (actor, command_id, entry_id, request_hash, result, applied_at)
    select r.actor, r."commandId", r."entryId", decode(r."requestHash", 'hex'), coalesce(r.result, 'null'::jsonb), r.at
    from jsonb_to_recordset(${JSON.stringify(rows)}::text::jsonb)
      as r(actor text, "commandId" text, "entryId" text, "requestHash" text, result jsonb, at timestamptz)
  `
}

/**
 * The answer to a command id applied before: refused if the id came with another request; else the
 * first result, projected again only for the same entry (its holder died before acknowledging it).
 * Another entry with an old id is a repeat sent later; projecting it would undo newer state.
 */
function repeatOf(previous: { entryId: string; result: unknown } | undefined, entryId: string, reused: boolean) {
  if (reused) return { result: { refused: 'idempotency_key_reused' } as unknown, project: false }
  return { result: previous?.result ?? null, project: previous?.entryId === entryId }
}

export interface TurnDeps {
  sql: Sql
  clock: Clock
  kinds: ActorKinds
  log: Log
  repairs: Repairs
  leaseMs: number
}

// A projection that fails is tried this often (backing off) before the actor's Redis state is repaired instead.
const projectionAttempts = 5

/**
 * The turn: the batch's transaction (throws `BatchFailed`, having changed nothing, if a command
 * fails; `committed` runs once it is done), then each actor's projections, in order, while it is held.
 */
export async function applyTurn(
  deps: TurnDeps,
  actors: BatchActor[],
  held: (actor: string) => boolean,
  committed?: () => void,
): Promise<BatchOutcome> {
  const outcome = await applyBatch(deps.sql, deps.clock, deps.kinds, actors)
  committed?.()
  await Promise.all([...outcome.applied].map(([actor, applied]) => project(deps, applied, () => held(actor))))
  return outcome
}

/**
 * One actor's projections in order. One that fails (Redis away) is tried again, so no later one
 * overtakes it; given up (still failing, the hold lost or the process closing), what is left is
 * repaired instead: the actor's Redis state is rebuilt from Postgres.
 */
async function project(deps: TurnDeps, applied: Applied[], held: () => boolean): Promise<void> {
  const due = (command: Applied) => command.project && !isRefusal(command.result) && command.handler?.project !== undefined
  let i = 0
  for (let attempt = 1; ; attempt++) {
    try {
      for (; i < applied.length; i++) {
        const command = applied[i]!
        if (due(command)) await command.handler!.project!(command.result, command.payload, command.context)
      }
      return
    } catch (error) {
      const actor = applied[i]!.context.actor
      deps.log.warn('actor projection failed', { actor, attempt, ...errorFields(error) })
      if (attempt < projectionAttempts && held()) {
        await Bun.sleep(Math.min(100 * 2 ** (attempt - 1), deps.leaseMs / 4))
        if (held()) continue
      }
      deps.log.error('actor projection given up; repairing the actor’s Redis state', { actor })
      for (const command of applied.slice(i)) if (due(command)) deps.repairs.add(command.handler, command.context)
      return
    }
  }
}
