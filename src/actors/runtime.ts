/**
 * The actor runtime of the workers: claims due actors (due.ts), takes them and works their mail in
 * batches (work.ts), and marks each one again by what is left: drained, due at once, or later (held
 * elsewhere, or failing). An actor whose command failed a batch is then worked alone (careful.ts).
 */
import { randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import { commandTimeoutMs, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errorFields, throttled, type Log, type Throttled } from '../log.ts'
import type { ActorKinds } from './types.ts'
import { createHolder, isHold, type Hold, type Holder } from './hold.ts'
import { createDue, type Due } from './due.ts'
import { isOutage, work, type WorkDeps, type Worked } from './work.ts'
import { createCareful, type Careful } from './careful.ts'

export interface ActorRuntimeOptions {
  sql: Sql
  redis: Redis
  keys: Keys
  kinds: ActorKinds
  clock: Clock
  log: Log
  /** How long a lease lasts unless renewed; a dead runtime's actors come due for the others after this. */
  leaseMs?: number
  /** Actors claimed and worked in one batch (one lease round trip, one transaction). */
  batchActors?: number
  /** Batches in flight at once: while one is in its transaction, the next is claimed. */
  batches?: number
  /** How long a runtime that found nothing due waits for the doorbell (due.ts) before it looks again. */
  idleSeconds?: number
  /** Told each command moved to its actor's dead-letter stream, by its type (careful.ts). */
  onDeadLetter?: (type: string) => void
  /** Test seam: runs after a command's effect and projection, before it is acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

export interface ActorRuntimeStats {
  /** Batch transactions committed, and the commands applied in them. */
  batches: number
  batchedCommands: number
  /** Commands applied one per turn (after a batch failed). */
  singleCommands: number
  /** Batches rolled back and worked again one command at a time. */
  rolledBack: number
}

export interface ActorRuntime {
  readonly id: string
  /** Counters since the start, for tests. */
  stats(): ActorRuntimeStats
  /** Stops claiming, lets the batches under way finish, and marks what they left due at once for the others. */
  stop(): Promise<void>
  /** Stops dead, like a killed process: no release, no acknowledgement (for tests). */
  abandon(): void
}

// Commands of one actor read per batch.
const perActor = 32

export async function startActorRuntime(options: ActorRuntimeOptions): Promise<ActorRuntime> {
  const { redis, keys, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  // How long a claim keeps its actors from the others before they come due again: long enough to take
  // their leases (which hold them then), short enough that a claim whose reply was lost (a timeout,
  // a connection dropped) or whose runtime died before the take hides them only a moment.
  const claimMs = Math.min(leaseMs, 2000)
  const id = randomUUID()
  // A holder per loop: a loop whose take failed lets go of what that take may have taken, which must
  // not be a lease its other loop holds (it is claimed again whenever a command marks it due).
  const holders = Array.from({ length: options.batches ?? 2 }, (_, n) => createHolder(redis, keys, `${id}:${n}`, leaseMs))
  const due = createDue(redis, keys)
  const stats: ActorRuntimeStats = { batches: 0, batchedCommands: 0, singleCommands: 0, rolledBack: 0 }
  const careful = createCareful(redis, keys, log, options.onDeadLetter)
  let running = true
  let abandoned = false
  let claims = 0
  // What repeats every round while Redis or Postgres is away is said once, then once a minute.
  const outage = throttled(log, 60_000)
  const depsOf = (holder: Holder): WorkDeps => ({ ...options, leaseMs, outage, holder, running: () => running, abandoned: () => abandoned })
  const round = createRound({ due, careful, stats, log, outage, leaseMs, running: () => running })

  // Idle loops wait on the doorbell together, on a connection of its own (a blocking call holds it).
  // Its BLPOP is timed by ioredis's blocking timeout (the call's own wait, and as long again as a
  // command may take), not the command timeout.
  const blocking = redis.duplicate({
    enableAutoPipelining: false,
    connectionName: 'agent-marketplace:actors-blocking',
    commandTimeout: undefined,
    blockingTimeout: commandTimeoutMs,
    blockingTimeoutGrace: commandTimeoutMs,
  })
  let waiting: Promise<unknown> | undefined
  const idle = () =>
    (waiting ??= due
      .wait(blocking, options.idleSeconds ?? 1)
      .catch(() => (running ? Bun.sleep(250) : undefined))
      .finally(() => (waiting = undefined)))

  const loop = async (holder: Holder) => {
    const deps = depsOf(holder)
    while (running) {
      const owner = `${id}:${++claims}`
      const actors = await due.claim(options.batchActors ?? 64, claimMs, owner).catch(error => {
        outage('warn', 'claim', 'actor claim failed; retrying', errorFields(error))
        return null
      })
      if (actors === null) await Bun.sleep(250)
      else if (actors.length === 0) await idle()
      else await round(deps, actors, owner).catch(error => log.error('actor round failed', { actors: actors.length, ...errorFields(error) }))
    }
  }
  const loops = Promise.all(holders.map(loop))

  return {
    id,
    stats: () => ({ ...stats }),
    async stop() {
      if (abandoned) return
      // Once: each disconnect of the ended connection would add a listener to its socket.
      if (running) blocking.disconnect()
      running = false
      await loops
    },
    abandon() {
      abandoned = true
      running = false
      for (const holder of holders) holder.abandon()
      blocking.disconnect()
    },
  }
}

/** What a round uses of its runtime: its marks, its careful actors, its counters, and whether it still runs. */
interface RoundDeps {
  due: Due
  careful: Careful
  stats: ActorRuntimeStats
  log: Log
  outage: Throttled
  leaseMs: number
  running: () => boolean
}

/** The commands a batch of holds applies (an entry with no list is no command). */
const commands = (holds: Hold[]) => holds.reduce((n, h) => n + h.mail.filter(m => m.list !== null).length, 0)

/** A runtime's round: takes the actors one claim brought, works them (a batch, careful ones alone), marks them again. */
function createRound({ due, careful, stats, log, outage, leaseMs, running }: RoundDeps) {
  /** Consecutive outages met by each actor, for its backoff. */
  const failures = new Map<string, number>()

  /**
   * Marks each actor again: its claim taken away once drained, due at once (whoever marked it last)
   * with mail left, put off while it keeps failing. Letting go failed: the claim comes due once the
   * lease would have run out.
   */
  const settle = (owner: string, worked: Worked, retryLater: (actor: string) => boolean) =>
    Promise.all(
      [...worked.left].map(([actor, left]) => {
        if (running() && retryLater(actor)) {
          const n = (failures.get(actor) ?? 0) + 1
          failures.set(actor, n)
          return due.settle(actor, owner, Math.min(2000, 100 * 2 ** n))
        }
        failures.delete(actor)
        if (left === undefined) return undefined
        return left === 0 && !worked.failure ? due.settle(actor, owner) : due.mark(actor)
      }),
    ).catch(error =>
      outage('warn', 'marks', 'actor due marks failed; the claims come due again', { actors: worked.left.size, ...errorFields(error) }),
    )

  /**
   * A turn an outage failed (Postgres or Redis refusing or away: a full disk, say) leaves its commands
   * waiting, their senders hearing 503: said once per kind of failure (its code: the message of a
   * full disk names a file), then once a minute.
   */
  const waitingOut = (worked: Worked, holds: Hold[]) => {
    const error = worked.failure?.error
    if (error === undefined || !running() || !isOutage(error)) return
    const fields = errorFields(error)
    outage('warn', `turn:${String(fields.code ?? fields.error)}`, 'actor turn failed; its commands wait in their mailboxes and are tried again', {
      actors: holds.length,
      ...fields,
    })
  }

  /** A batch of the actors not careful: one turn; a command that fails it makes its actor careful. */
  const batch = async (deps: WorkDeps, holds: Hold[], owner: string) => {
    const worked = await work(deps, holds)
    const { failure } = worked
    waitingOut(worked, holds)
    if (!failure) Object.assign(stats, { batches: stats.batches + 1, batchedCommands: stats.batchedCommands + commands(holds) })
    else if (failure.culprit && !isOutage(failure.error) && running()) {
      stats.rolledBack++
      careful.begin(failure.culprit)
      log.debug('actor batch rolled back; the actor at fault goes one command at a time', { actor: failure.culprit, ...errorFields(failure.error) })
    }
    await settle(owner, worked, () => failure !== undefined && isOutage(failure.error))
  }

  /** A careful actor's one command, in a turn of its own. */
  const alone = async (deps: WorkDeps, hold: Hold, owner: string) => {
    const worked = await work(deps, [hold], (failed, cause) => careful.refuse(failed, cause, running()))
    waitingOut(worked, [hold])
    if (!worked.failure) {
      stats.singleCommands += commands([hold])
      careful.end(hold.actor)
    }
    await settle(owner, worked, actor => worked.failure !== undefined && careful.has(actor))
  }

  /** Takes the claimed actors (careful ones one command each), works them, marks them again. */
  return async (deps: WorkDeps, actors: string[], owner: string) => {
    const { holder } = deps
    // Worked as taken: an actor the other loop made careful while this take was under way holds a
    // batch's mail, which only a batch may work (a turn alone answers its first command for its failure).
    const singly = new Set(actors.filter(actor => careful.has(actor)))
    const taken = await holder.take(actors.map(actor => ({ actor, mail: singly.has(actor) ? 1 : perActor })))
    const holds: Hold[] = []
    const later = taken.map((t, i) => {
      if (t instanceof Error) {
        if (running()) outage('warn', 'lease', 'actor lease failed; retrying', { actor: actors[i], ...errorFields(t) })
        // The lease may have been taken, its reply lost: let go of it.
        return holder.release(actors[i]!, []).then(() => due.settle(actors[i]!, owner, 1000))
      }
      // Held elsewhere. A live holder marks the actor due as it lets go with mail left, but one backing
      // off after an outage only puts off its own mark, not this one: look again in half a lease at
      // most. A dead holder never lets go: look again as its lease runs out, if that is sooner.
      if (!isHold(t)) return due.settle(actors[i]!, owner, t.leftMs >= 0 ? Math.min(leaseMs / 2, t.leftMs + 1) : leaseMs / 2)
      holds.push(t)
      return undefined
    })
    const quick = holds.filter(h => !singly.has(h.actor))
    const slow = holds.filter(h => singly.has(h.actor))
    const done = await Promise.allSettled([...later, quick.length > 0 && batch(deps, quick, owner), ...slow.map(h => alone(deps, h, owner))])
    for (const outcome of done) if (outcome.status === 'rejected') log.warn('actor round step failed', errorFields(outcome.reason))
  }
}
