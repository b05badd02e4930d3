/**
 * Commands of idle actors applied by the process that sends them. An actor with no holder and no mail
 * is taken under its lease right here and its command applied in a batch transaction shared with the
 * other idle actors' commands of the moment (the runtime's `applyBatch`), with no mailbox entry, no
 * runtime hop and no reply message. An actor that is held or has mail is `busy`: the command goes to
 * its mailbox, behind what is there, so each actor's commands still apply one at a time, in order.
 */
import { randomUUID } from 'node:crypto'
import postgres from 'postgres'
import { isConnectionError } from '../db.ts'
import { defineBatchedScript } from '../redis.ts'
import { errorFields } from '../log.ts'
import { errors } from '../errors.ts'
import { raiseFence, renewLease } from './lease.ts'
import { applyBatch, BatchFailed, type Applied, type BatchOutcome } from './batch.ts'
import { createRepairs } from './repairs.ts'
import { isRefusal } from './types.ts'
import type { ActorRuntimeOptions } from './runtime.ts'

export interface InlineCommand {
  type: string
  payload: unknown
  commandId: string
  /** The sender chose the id (an Idempotency-Key): it may come again and is recorded as applied. */
  chosen: boolean
  requestHash: string | null
}

/** What became of a command: its result, or `mailed` (its actor was busy; it is in the mailbox now). */
export type InlineAnswer = { result: unknown } | 'mailed'

export interface InlineRunner {
  /** Whether commands of this type for this actor are applied here. */
  serves(actor: string, type: string): boolean
  /**
   * Applies the command if its actor is idle, else hands it to `toMailbox` (which sends it to the
   * actor's mailbox), always after the commands this process gave it before for that actor.
   */
  ask(actor: string, command: InlineCommand, toMailbox: () => Promise<unknown>): Promise<InlineAnswer>
  /** Takes no more commands (they go to the mailboxes) and waits for those under way. */
  close(): Promise<void>
}

/** The runtime's own settings, meaning the same here (`batches`: transactions in flight at once). */
export type InlineOptions = Pick<
  ActorRuntimeOptions,
  'sql' | 'redis' | 'keys' | 'kinds' | 'clock' | 'log' | 'leaseMs' | 'batchActors' | 'batches'
>

// K lease, fence, mailbox; A holder, ms (of each actor: the calls of a tick leave together). Takes the
// lease and draws the fencing token, but only of an actor with no mail: a command must not overtake one
// queued before it. Null for an actor held or with mail; a lease taken whose token could not be drawn
// is let go again.
const enter = defineBatchedScript(
  `
if redis.call('XLEN', K[3]) > 0 then return nil end
if not redis.call('SET', K[1], A[1], 'NX', 'PX', A[2]) then return nil end
local ok, token = pcall(redis.call, 'INCR', K[2])
if not ok then
  redis.call('DEL', K[1])
  error(token)
end
return token`,
  3,
  2,
)

// K mailbox, lease; A holder (of each actor). Lets go of the lease and says how much mail is left.
const leave = defineBatchedScript(
  `
if redis.call('GET', K[2]) == A[1] then redis.call('DEL', K[2]) end
return redis.call('XLEN', K[1])`,
  2,
  1,
)

interface Pending {
  command: InlineCommand
  toMailbox(): Promise<unknown>
  resolve(answer: InlineAnswer): void
  reject(error: unknown): void
}

/** Sends an actor's commands to its mailbox, one after another: their order is the actor's. */
async function mail(pending: Pending[]) {
  for (const p of pending) await p.toMailbox().then(() => p.resolve('mailed'), p.reject)
}

interface Hold {
  actor: string
  kind: string
  token: number
  pending: Pending[]
  /** Let go, or found lost by a renewal: the lease is no longer renewed. */
  done?: boolean
}

/**
 * Certainly not committed: a command failed inside the transaction (which was then rolled back), or
 * Postgres itself refused it, COMMIT included. A lost connection or any other error may have come
 * after the commit.
 */
function rolledBack(error: unknown): boolean {
  if (error instanceof postgres.PostgresError) return true
  return error instanceof BatchFailed && !isConnectionError(error.cause)
}

export function createInlineRunner(options: InlineOptions): InlineRunner {
  const { sql, redis, keys, kinds, clock, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  const batchActors = options.batchActors ?? 256
  const batches = options.batches ?? 2
  const holder = `inline:${randomUUID()}`
  /** Commands waiting for a batch, by actor, in the order they came. */
  const queued = new Map<string, Pending[]>()
  /** Actors in a running batch: their next commands wait for it to end. */
  const working = new Set<string>()
  const running = new Set<Promise<void>>()
  let scheduled = false
  let closed = false
  const repairs = createRepairs(log)

  /** Batches in their transaction (or taking their leases): the projections and releases that follow hold no slot. */
  let slots = 0

  const schedule = () => {
    if (scheduled || closed || slots >= batches) return
    scheduled = true
    setImmediate(flush)
  }

  const flush = () => {
    scheduled = false
    while (slots < batches) {
      const batch = new Map<string, Pending[]>()
      for (const [actor, pending] of queued) {
        if (working.has(actor)) continue
        queued.delete(actor)
        working.add(actor)
        batch.set(actor, pending)
        if (batch.size >= batchActors) break
      }
      if (batch.size === 0) return
      slots++
      let freed = false
      const free = () => {
        if (freed) return
        freed = true
        slots--
        if (queued.size > 0) schedule()
      }
      const run = work(batch, free)
        .catch(error => {
          // Not expected (every step handles its own failures); the actors' commands must not hang.
          log.error('inline actor batch failed', { actors: batch.size, ...errorFields(error) })
          const failure = errors.unavailable('The command could not be applied; it may have been')
          for (const pending of batch.values()) for (const p of pending) p.reject(failure)
        })
        .finally(() => {
          free()
          for (const actor of batch.keys()) working.delete(actor)
          running.delete(run)
          if (queued.size > 0) schedule()
        })
      running.add(run)
    }
  }

  const release = (actor: string) => {
    const k = keys.actor(actor)
    return leave(redis, [k.mailbox, k.lease], [holder])
      .then(async left => {
        // Mail sent while this process held the actor: a runtime that found it held is told to look again.
        if (Number(left) > 0) await redis.xadd(keys.actorsReady, '*', 'actor', actor)
      })
      // Without the hint the runtimes' sweep still finds the mail; without the release the lease runs out.
      .catch(error => log.warn('inline actor release failed', { actor, ...errorFields(error) }))
  }

  const work = async (batch: Map<string, Pending[]>, free: () => void): Promise<void> => {
    const actors = [...batch.keys()]
    const entered = await Promise.allSettled(
      actors.map(actor => {
        const k = keys.actor(actor)
        return enter(redis, [k.lease, k.fence, k.mailbox], [holder, leaseMs])
      }),
    )
    const holds: Hold[] = []
    const busy: Promise<void>[] = []
    actors.forEach((actor, i) => {
      const settled = entered[i]!
      const pending = batch.get(actor)!
      // Held, with mail, or Redis failing: the mailbox path takes it (and reports an outage itself).
      // A failed call may still have taken the lease (the reply was lost): let go of it first, or the
      // mail would wait for it to run out.
      if (settled.status === 'rejected') busy.push(release(actor).then(() => mail(pending)))
      else if (settled.value === null) busy.push(mail(pending))
      else holds.push({ actor, kind: actor.slice(0, actor.indexOf(':')), token: Number(settled.value), pending })
    })
    // The actor stays in `working` until its commands are in the mailbox: none sent later overtakes them.
    const mailed = Promise.all(busy)
    if (holds.length === 0) {
      free()
      return void (await mailed)
    }

    // The leases are renewed while held (transaction, projections, announcements), as the runtime
    // renews its own: a slow step lets no other holder in before this one is done.
    const renewal = setInterval(() => renew(holds), leaseMs / 3)
    try {
      await apply(holds, free)
    } finally {
      clearInterval(renewal)
    }
    await mailed
  }

  const letGo = (h: Hold) => {
    h.done = true
    return release(h.actor)
  }

  const renew = (holds: Hold[]) => {
    for (const h of holds) {
      if (h.done) continue
      renewLease({ redis, keys }, h.actor, holder, leaseMs).then(
        kept => {
          if (kept || h.done) return
          // Taken over (or expired): renewing stops, as the runtime's does; the fence keeps Postgres right.
          h.done = true
          log.warn('inline actor lease lost while held', { actor: h.actor })
        },
        // Redis away: the next renewal tries again; the lease runs out only if it stays away.
        () => {},
      )
    }
  }

  /** Applies the taken actors' commands in one batch, then projects, answers, announces and lets go. */
  const apply = async (holds: Hold[], free: () => void) => {
    let outcome: BatchOutcome
    try {
      outcome = await applyBatch(
        sql,
        clock,
        kinds,
        holds.map(h => ({
          actor: h.actor,
          kind: h.kind,
          token: h.token,
          commands: h.pending.map(({ command }) => ({
            commandId: command.commandId,
            // Each sending of a chosen id is its own "entry": a repeat is answered, never projected again.
            entryId: command.chosen ? `inline:${randomUUID()}` : command.commandId,
            type: command.type,
            payload: () => command.payload,
            requestHash: command.requestHash,
            mayRepeat: command.chosen,
            record: command.chosen,
          })),
        })),
      )
    } catch (error) {
      free()
      await Promise.all(holds.map(letGo))
      if (!rolledBack(error)) {
        // The commit may or may not have happened: answer as for any outage, never apply it again.
        log.warn('inline actor batch failed', { actors: holds.length, ...errorFields(error) })
        const unavailable = errors.unavailable('The command could not be applied; it may have been')
        for (const h of holds) for (const p of h.pending) p.reject(unavailable)
      } else {
        // Rolled back: the runtime's careful path tells the failing command from the others.
        log.debug('inline actor batch rolled back; its commands go to the mailboxes', { actors: holds.length, ...errorFields(error) })
        await Promise.all(holds.map(h => mail(h.pending)))
      }
      return
    }
    free()

    await Promise.all(
      holds.map(async h => {
        const newest = outcome.fenced.get(h.actor)
        const applied = outcome.applied.get(h.actor)
        if (newest !== undefined || !applied) {
          // Redis lost the fence counter and handed out an old token: lift it, and let the mailbox path apply.
          if (newest !== undefined) await raiseFence({ redis, keys }, h.actor, newest).catch(() => {})
          await letGo(h)
          return mail(h.pending)
        }
        await project(h, applied)
        h.pending.forEach((p, i) => p.resolve({ result: applied[i]!.result }))
        await letGo(h)
      }),
    )
  }

  /**
   * The projections, in order, while the lease is held. One that fails (Redis away) is tried again,
   * the batch's renewals keeping the lease, so no later command's projection can overtake it; should
   * the lease be lost meanwhile, a newer holder owns the projected state and this one gives up: the
   * actor's Redis state is then repaired (rebuilt from Postgres), as it is when the process closes.
   */
  const project = async (h: Hold, applied: Applied[]) => {
    let i = 0
    let delay = 100
    for (;;) {
      try {
        for (; i < applied.length; i++) {
          const command = applied[i]!
          if (command.project && !isRefusal(command.result)) {
            await command.handler?.project?.(command.result, command.payload, command.context)
          }
        }
        return
      } catch (error) {
        log.warn('inline actor projection failed; retrying', { actor: h.actor, ...errorFields(error) })
        await Bun.sleep(delay)
        delay = Math.min(delay * 2, leaseMs / 4)
        if (h.done || closed) {
          log.error('inline actor projection given up; repairing', { actor: h.actor, reason: closed ? 'shutting down' : 'lease lost' })
          for (const command of applied.slice(i)) {
            if (command.project && !isRefusal(command.result)) repairs.add(command.handler, command.context)
          }
          return
        }
      }
    }
  }

  return {
    serves: (actor, type) => kinds[actor.slice(0, actor.indexOf(':'))]?.[type] !== undefined,
    ask(actor, command, toMailbox) {
      if (closed && !working.has(actor) && !queued.has(actor)) return toMailbox().then(() => 'mailed' as const)
      return new Promise<InlineAnswer>((resolve, reject) => {
        const list = queued.get(actor)
        const pending = { command, toMailbox, resolve, reject }
        if (list) list.push(pending)
        else queued.set(actor, [pending])
        schedule()
      })
    },
    async close() {
      closed = true
      while (running.size > 0 || queued.size > 0) {
        await Promise.allSettled([...running])
        // Commands that wait behind a batch go to the mailboxes, each actor's in order.
        const waiting = [...queued.values()]
        queued.clear()
        await Promise.all(waiting.map(mail))
      }
      await repairs.close()
    },
  }
}
