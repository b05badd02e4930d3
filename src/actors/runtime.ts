/**
 * The actor runtime: finds actors with mail through a shared hint stream, holds each one through a
 * renewed, fenced lease, and applies its commands one at a time, in order, exactly once in effect.
 *
 * Actors are worked in batches. One script call per actor (pipelined for the whole batch) takes the
 * lease and reads the mail; one Postgres transaction fences every actor of the batch and applies all
 * the commands read, each actor's in order and the actors side by side on the transaction's
 * connection; the projections, replies and acknowledgements then go out together. When a batch's
 * transaction fails (a failing handler, bad input, an outage), its actors are worked again one
 * command per transaction, which tells the failing command from the others, counts its attempts
 * towards the dead-letter stream and refuses bad input: the path every command took before batches.
 */
import { randomUUID } from 'node:crypto'
import { isBadInput, isConnectionError, type Sql } from '../db.ts'
import { defineScript, isRedisUnavailable, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log } from '../log.ts'
import { appliedCommand, claimCommand, enterFence, recordResult } from './store.ts'
import { raiseFence, renewLease } from './lease.ts'
import { isRefusal, type ActorKinds, type CommandContext } from './types.ts'
import { applyBatch, BatchFailed, finishAndRelease, repeatOf, type Applied, type BatchOutcome } from './batch.ts'
import { createRepairs } from './repairs.ts'

export interface ActorRuntimeOptions {
  sql: Sql
  redis: Redis
  keys: Keys
  kinds: ActorKinds
  clock: Clock
  log: Log
  /** How long a lease lasts unless renewed; a dead runtime's actors move on after this. */
  leaseMs?: number
  /** Hints read by a runtime that went quiet this long are taken over. */
  claimIdleMs?: number
  /** Actors held at once by this runtime. */
  concurrency?: number
  /** Actors worked in one batch (one lease round trip, one transaction). */
  batchActors?: number
  /** Batches in flight at once: while one is in its transaction, the next is gathered. */
  batches?: number
  /** How often mailboxes are swept for mail whose hint was lost. */
  sweepEveryMs?: number
  /** Test seam: runs after a command's effect and projection, before it is acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

export interface ActorRuntimeStats {
  /** Batch transactions committed, and the commands applied in them. */
  batches: number
  batchedCommands: number
  /** Commands applied on the careful path, one transaction each (after a batch failed). */
  singleCommands: number
  /** Batches rolled back and worked again one command at a time. */
  rolledBack: number
}

export interface ActorRuntime {
  readonly id: string
  /** Counters since the start, for metrics and tests. */
  stats(): ActorRuntimeStats
  /** Stops taking work, lets running commands finish, releases leases, hands unfinished actors on. */
  stop(): Promise<void>
  /** Stops dead, like a killed process: no release, no acknowledgement (for tests). */
  abandon(): void
}

const hintGroup = 'runtimes'
const mailboxGroup = 'actor'
// One consumer name for every holder: the next holder of an actor reads what the last one left unacknowledged.
const mailboxConsumer = 'holder'
// Commands of one actor read per batch.
const perActor = 32
// A command that fails this often for a reason other than an outage goes to the dead-letter stream.
const maxAttempts = 5

// KEYS lease, fence, mailbox; ARGV holder, ms, group, consumer, count. Takes the lease (null when
// someone holds it), draws the fencing token, and reads first what a previous holder read and never
// acknowledged (it may have died mid-command; the third element is then 1), else new mail. Makes
// the mailbox's group on first use.
const claim = defineScript(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local token = redis.call('INCR', KEYS[2])
local function failed(found) return type(found) == 'table' and found.err end
local function give_up(found)
  redis.call('DEL', KEYS[1])
  error(found.err)
end
local function read(from)
  local found = redis.pcall('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', ARGV[5], 'STREAMS', KEYS[3], from)
  if failed(found) then
    if not string.find(found.err, 'NOGROUP', 1, true) then give_up(found) end
    redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0', 'MKSTREAM')
    found = redis.pcall('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', ARGV[5], 'STREAMS', KEYS[3], from)
    if failed(found) then give_up(found) end
  end
  if found then return found[1][2] end
  return {}
end
local entries = read('0')
if #entries > 0 then return {token, entries, 1} end
return {token, read('>'), 0}`)
// KEYS mailbox; ARGV group, entry ids. Acknowledges finished entries and deletes them.
const finish = defineScript(`
redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return 1`)
type Entry = [id: string, fields: string[] | null]
/** What became of an actor in a batch. `more`: its mailbox still holds mail; work it again soon. */
type Drain = 'drained' | 'more' | 'held' | 'interrupted' | 'failed'

interface Mail {
  entryId: string
  /** Read before by a holder that never acknowledged it: it may have been applied. */
  redelivered: boolean
  /** Null for an entry deleted while pending: it was finished already. */
  list: string[] | null
  fields: Record<string, string>
}

interface Held {
  actor: string
  kind: string
  mailbox: string
  lease: string
  token: number
  mail: Mail[]
  /** The entries of `mail` that carry a command (not deleted ones), in order. */
  commands: Mail[]
}

/** Another holder took the actor over while this one was paused; stop at once. */
class FencedOut extends Error {}

function transient(error: unknown): boolean {
  const code = (error as { code?: string } | null)?.code
  return isConnectionError(error) || isRedisUnavailable(error) || code === '40001' || code === '40P01'
}

export async function startActorRuntime(options: ActorRuntimeOptions): Promise<ActorRuntime> {
  const { sql, redis, keys, kinds, clock, log } = options
  const repairs = createRepairs(log)
  const leaseMs = options.leaseMs ?? 10_000
  const claimIdleMs = options.claimIdleMs ?? leaseMs + 5000
  const concurrency = options.concurrency ?? 256
  const batchActors = Math.max(1, Math.min(options.batchActors ?? 64, concurrency))
  const batches = options.batches ?? 2
  const id = randomUUID()
  const blocking = redis.duplicate({ enableAutoPipelining: false, connectionName: 'agent-marketplace:actors-blocking' })

  let running = true
  let abandoned = false
  /** Hinted and waiting for a batch. */
  const ready = new Set<string>()
  /** In a running batch. */
  const active = new Set<string>()
  /** Hinted again while in a batch. */
  const again = new Set<string>()
  /** Actors whose last batch failed after its commit: worked one command at a time until they succeed. */
  const careful = new Set<string>()
  const hints = new Map<string, Set<string>>()
  const attempts = new Map<string, number>()
  const failures = new Map<string, number>()
  const drains = new Set<Promise<void>>()
  const timers = new Set<ReturnType<typeof setTimeout>>()
  let inFlight = 0
  const stats: ActorRuntimeStats = { batches: 0, batchedCommands: 0, singleCommands: 0, rolledBack: 0 }

  // Replies bound for one process that are ready in the same turn of the event loop go out as one
  // message (a JSON array): one PUBLISH for a batch's answers instead of one each.
  const outgoing = new Map<string, { replies: unknown[]; sent: Promise<void> }>()
  const reply = (channel: string, answer: unknown): Promise<void> => {
    let pending = outgoing.get(channel)
    if (!pending) {
      const replies: unknown[] = []
      const sent = new Promise<void>((resolve, reject) =>
        setImmediate(() => {
          outgoing.delete(channel)
          redis.publish(channel, JSON.stringify(replies.length === 1 ? replies[0] : replies)).then(() => resolve(), reject)
        }),
      )
      pending = { replies, sent }
      outgoing.set(channel, pending)
    }
    pending.replies.push(answer)
    return pending.sent
  }

  const ensureHintGroup = () => redis.xgroup('CREATE', keys.actorsReady, hintGroup, '0', 'MKSTREAM').catch(ignoreBusyGroup)
  await ensureHintGroup()

  const later = (ms: number, fn: () => void) => {
    const timer = setTimeout(() => {
      timers.delete(timer)
      fn()
    }, ms)
    timers.add(timer)
  }
  const keep = (actor: string, ids: string[]) => {
    if (ids.length === 0 && hints.has(actor)) return
    const set = hints.get(actor) ?? new Set<string>()
    for (const hintId of ids) set.add(hintId)
    hints.set(actor, set)
  }

  const hint = (actor: string, hintId: string | null) => {
    if (!running) return
    if (hintId) keep(actor, [hintId])
    if (active.has(actor)) again.add(actor)
    else ready.add(actor)
  }

  /** Starts batches while there are ready actors and room for them. */
  const pump = () => {
    while (running && ready.size > 0 && inFlight < batches && active.size < concurrency) {
      const size = Math.min(batchActors, concurrency - active.size)
      const actors: string[] = []
      for (const actor of ready) {
        ready.delete(actor)
        active.add(actor)
        actors.push(actor)
        if (actors.length >= size) break
      }
      inFlight++
      const run = runBatch(actors).finally(() => {
        inFlight--
        pump()
      })
      drains.add(run)
      void run.finally(() => drains.delete(run))
    }
  }

  const runBatch = async (actors: string[]): Promise<void> => {
    const taken = new Map<string, string[]>()
    for (const actor of actors) {
      taken.set(actor, [...(hints.get(actor) ?? [])])
      hints.delete(actor)
    }
    let outcomes: Map<string, Drain>
    try {
      outcomes = await work(actors)
    } catch (error) {
      // Claiming the leases failed (Redis is away): nothing was taken, try again later.
      if (running) log.warn('actor batch failed; retrying', { actors: actors.length, ...errorFields(error) })
      outcomes = new Map(actors.map(actor => [actor, 'failed']))
    }
    for (const actor of actors) active.delete(actor)
    if (abandoned) return
    await settle(outcomes, taken)
  }

  /** Hint bookkeeping after a batch: acknowledged once an actor is drained, kept while it is not. */
  const settle = async (outcomes: Map<string, Drain>, taken: Map<string, string[]>) => {
    const acknowledge: string[] = []
    const handOn: string[] = []
    for (const [actor, drained] of outcomes) {
      let ids = taken.get(actor) ?? []
      // Stopping with mail left, or with a hint that came in meanwhile: hand the actor on.
      const outcome = !running && (drained === 'more' || (drained === 'drained' && again.has(actor))) ? 'interrupted' : drained
      if (outcome === 'interrupted') {
        ids = [...ids, ...(hints.get(actor) ?? [])]
        hints.delete(actor)
      }
      if (outcome === 'drained') {
        failures.delete(actor)
        acknowledge.push(...ids)
        if (again.delete(actor)) ready.add(actor)
      } else if (outcome === 'more' && running) {
        failures.delete(actor)
        keep(actor, ids)
        again.delete(actor)
        ready.add(actor)
      } else if (outcome === 'interrupted') {
        // Stopping, or the lease moved on: leave a fresh hint so whoever runs next looks at it.
        handOn.push(actor)
        acknowledge.push(...ids)
        again.delete(actor)
      } else {
        // Held elsewhere (a dead holder never rechecks) or failing (an outage): keep the hints, retry later.
        keep(actor, ids)
        again.delete(actor)
        if (outcome === 'held') {
          // Another runtime works it now: what this one remembered of its failures is of no use.
          careful.delete(actor)
          for (const key of attempts.keys()) if (key.startsWith(`${actor} `)) attempts.delete(key)
        }
        const failed = outcome === 'failed' ? (failures.get(actor) ?? 0) + 1 : 0
        if (failed > 0) failures.set(actor, failed)
        const delay = failed > 0 ? Math.min(30_000, 250 * 2 ** Math.min(failed, 7)) : leaseMs / 2
        later(delay, () => {
          hint(actor, null)
          pump()
        })
      }
    }
    try {
      await Promise.all([
        ...handOn.map(actor => redis.xadd(keys.actorsReady, '*', 'actor', actor)),
        acknowledge.length > 0 ? redis.xack(keys.actorsReady, hintGroup, ...acknowledge) : undefined,
      ])
    } catch (error) {
      log.warn('actor hint bookkeeping failed', { actors: outcomes.size, ...errorFields(error) })
      for (const actor of handOn) {
        keep(actor, taken.get(actor) ?? [])
        later(1000, () => {
          hint(actor, null)
          pump()
        })
      }
    }
  }

  /** Takes the actors' leases, applies their mail and lets go: what became of each. */
  const work = async (actors: string[]): Promise<Map<string, Drain>> => {
    const outcomes = new Map<string, Drain>()
    const claims = await Promise.allSettled(
      actors.map(actor => {
        const k = keys.actor(actor)
        return claim(redis, [k.lease, k.fence, k.mailbox], [id, leaseMs, mailboxGroup, mailboxConsumer, perActor])
      }),
    )
    const held: Held[] = []
    actors.forEach((actor, i) => {
      const settled = claims[i]!
      if (settled.status === 'rejected') {
        if (running) log.warn('actor lease failed; retrying', { actor, ...errorFields(settled.reason) })
        return void outcomes.set(actor, 'failed')
      }
      const claimed = settled.value as [number, Entry[], number] | null
      if (claimed === null) return void outcomes.set(actor, 'held')
      const k = keys.actor(actor)
      const mail: Mail[] = claimed[1].map(([entryId, list]) => ({ entryId, redelivered: claimed[2] === 1, list, fields: list ? toRecord(list) : {} }))
      held.push({
        actor,
        kind: actor.slice(0, actor.indexOf(':')),
        mailbox: k.mailbox,
        lease: k.lease,
        token: Number(claimed[0]),
        mail,
        commands: mail.filter(m => m.list !== null),
      })
    })
    if (held.length === 0) return outcomes

    const lost = new Set<string>()
    // Let go of (or about to be): a renewal answered after the release is no sign of a lost lease.
    const letGo = new Set<string>()
    const renewal = setInterval(() => {
      if (abandoned) return clearInterval(renewal)
      for (const { actor } of held) {
        if (letGo.has(actor)) continue
        const lose = () => {
          if (!letGo.has(actor)) lost.add(actor)
        }
        renewLease({ redis, keys }, actor, id, leaseMs).then(renewed => {
          if (!renewed) lose()
        }, lose)
      }
    }, leaseMs / 3)
    try {
      const withMail = held.filter(h => h.commands.length > 0)
      const quick = withMail.filter(h => !careful.has(h.actor))
      let batch: BatchOutcome | undefined
      if (quick.length > 0) {
        try {
          batch = await applyHeld(quick)
          stats.batches++
          stats.batchedCommands += quick.reduce((n, h) => n + h.commands.length, 0)
        } catch (error) {
          stats.rolledBack++
          // The actor whose command failed first goes one command at a time until it succeeds, so it does
          // not take the next batches down with it; this batch's actors are all worked that way now.
          if (error instanceof BatchFailed) careful.add(error.actor)
          log.debug('actor batch rolled back; applying its commands one at a time', { actors: quick.length, ...errorFields(error) })
        }
      }
      await Promise.all(
        held.map(async h => {
          let outcome: Drain | 'applied'
          let left: number
          if (batch?.applied.has(h.actor)) {
            ;[outcome, left] = await finishBatch(h, batch.applied.get(h.actor)!, () => letGo.add(h.actor))
          } else {
            if (batch?.fenced.has(h.actor)) {
              await raiseFence({ redis, keys }, h.actor, batch.fenced.get(h.actor)!).catch(() => {})
              outcome = 'interrupted'
            } else {
              outcome = await oneByOne(h, () => lost.has(h.actor) || !running)
            }
            if (abandoned) return new Promise<never>(() => {})
            letGo.add(h.actor)
            left = Number(await finishAndRelease(redis, [h.mailbox, h.lease], [mailboxGroup, id]).catch(() => 1))
          }
          if (abandoned) return new Promise<never>(() => {})
          // Mail left after a round that read nothing came in after the read; its own hint brings the actor back.
          if (outcome === 'applied') outcome = lost.has(h.actor) ? 'interrupted' : left === 0 || h.mail.length === 0 ? 'drained' : 'more'
          outcomes.set(h.actor, outcome)
        }),
      )
    } finally {
      clearInterval(renewal)
    }
    return outcomes
  }

  const applyHeld = (held: Held[]) =>
    applyBatch(
      sql,
      clock,
      kinds,
      held.map(h => ({
        actor: h.actor,
        kind: h.kind,
        token: h.token,
        commands: h.commands.map(mail => ({
          commandId: commandIdOf(mail),
          entryId: mail.entryId,
          type: mail.fields.type ?? '',
          payload: () => JSON.parse(mail.fields.payload ?? 'null'),
          requestHash: mail.fields.hash || null,
          mayRepeat: mail.redelivered || mail.fields.repeatable === '1',
          record: true,
        })),
      })),
    )

  /**
   * After the batch's commit: projections in order, then the replies, the announcements, and the
   * acknowledgements with the lease's release in one call. Returns what became of the actor and how
   * much mail is left.
   */
  const finishBatch = async (h: Held, applied: Applied[], releasing: () => void): Promise<[Drain | 'applied', number]> => {
    const done: { mail: Mail; result: unknown }[] = h.mail.filter(m => m.list === null).map(mail => ({ mail, result: undefined }))
    let outcome: Drain | 'applied' = 'applied'
    try {
      for (const [i, mail] of h.commands.entries()) {
        const command = applied[i]!
        if (command.project && !isRefusal(command.result)) {
          await command.handler?.project?.(command.result, command.payload, command.context)
        }
        await options.beforeAck?.(h.actor, command.context.commandId)
        if (abandoned) return new Promise<never>(() => {})
        done.push({ mail, result: command.result })
      }
    } catch (error) {
      if (!running) outcome = 'interrupted'
      else {
        // The projection failed: from here on this actor goes one command at a time, counting attempts.
        careful.add(h.actor)
        log.warn('actor projection failed; retrying', { actor: h.actor, ...errorFields(error) })
        outcome = 'failed'
      }
    }
    // Answers first, then the acknowledgement: a crash between the two repeats an answer rather than losing it.
    // Answers that could not be sent leave their entries unacknowledged, to be answered on redelivery.
    let finished = done
    await Promise.all(
      done.filter(d => d.mail.fields.reply).map(d => reply(d.mail.fields.reply!, { ask: d.mail.fields.ask, result: d.result })),
    ).catch(error => {
      log.warn('actor reply failed; retrying', { actor: h.actor, ...errorFields(error) })
      finished = done.filter(d => d.mail.list === null)
      careful.add(h.actor)
      outcome = running ? 'failed' : 'interrupted'
    })
    releasing()
    const left = await finishAndRelease(redis, [h.mailbox, h.lease], [mailboxGroup, id, ...finished.map(d => d.mail.entryId)]).then(
      Number,
      error => {
        log.warn('actor acknowledgement failed', { actor: h.actor, ...errorFields(error) })
        return 1
      },
    )
    return [outcome, left]
  }

  /** The careful path: each command in its own transaction. */
  const oneByOne = async (h: Held, stopped: () => boolean): Promise<Drain | 'applied'> => {
    try {
      for (const mail of h.mail) {
        if (stopped()) return 'interrupted'
        // Entries deleted while pending come back without fields: they were finished already.
        if (mail.list === null) await redis.xack(h.mailbox, mailboxGroup, mail.entryId)
        else await applyEntry(h.actor, h.mailbox, mail, h.token)
      }
      careful.delete(h.actor)
      return 'applied'
    } catch (error) {
      if (error instanceof FencedOut) return 'interrupted'
      if (running) log.warn('actor drain failed; retrying', { actor: h.actor, ...errorFields(error) })
      return running ? 'failed' : 'interrupted'
    }
  }

  const applyEntry = async (actor: string, mailbox: string, mail: Mail, token: number) => {
    const { entryId, fields } = mail
    const list = mail.list!
    const kind = actor.slice(0, actor.indexOf(':'))
    const handler = kinds[kind]?.[fields.type ?? '']
    const commandId = commandIdOf(mail)
    const attemptKey = `${actor} ${entryId}`
    let outcome: { result: unknown; project: boolean; context: CommandContext; payload: unknown; fresh?: boolean } | undefined
    try {
      if (!handler) throw new Error(`no handler for ${kind} command ${fields.type}`)
      const payload = JSON.parse(fields.payload ?? 'null')
      const requestHash = fields.hash ? Buffer.from(fields.hash, 'hex') : null
      outcome = await sql.begin(async tx => {
        const fence = await enterFence(tx, actor, token, clock.now())
        if ('newest' in fence) {
          await raiseFence({ redis, keys }, actor, fence.newest)
          throw new FencedOut()
        }
        const context: CommandContext = { actor, id: actor.slice(kind.length + 1), commandId, at: fence.at }
        if (await claimCommand(tx, { actor, commandId, entryId, requestHash, at: fence.at })) {
          const result = await handler.apply(tx, payload, context)
          await recordResult(tx, actor, commandId, result)
          return { result, project: true, context, payload, fresh: true }
        }
        const previous = await appliedCommand(tx, actor, commandId)
        const reused = requestHash !== null && previous?.requestHash != null && !previous.requestHash.equals(requestHash)
        return { context, payload, ...repeatOf(previous, entryId, reused) }
      })
      if (outcome.fresh) stats.singleCommands++
      if (outcome.project && !isRefusal(outcome.result)) {
        await handler.project?.(outcome.result, outcome.payload, outcome.context)
      }
      attempts.delete(attemptKey)
    } catch (error) {
      if (error instanceof FencedOut || transient(error) || !running) throw error
      if (isBadInput(error)) {
        // The command itself cannot be stored: refuse it at once rather than retry it five times.
        outcome = { result: { refused: 'invalid_input' }, project: false, context: undefined as never, payload: null }
      } else {
        const count = (attempts.get(attemptKey) ?? 0) + 1
        attempts.set(attemptKey, count)
        if (count < maxAttempts) throw error
        attempts.delete(attemptKey)
        log.error('actor command moved to the dead-letter stream', { actor, type: fields.type, entryId, ...errorFields(error) })
        // Applied, but its projection kept failing: the actor's Redis state is rebuilt instead.
        if (outcome) repairs.add(handler, outcome.context)
        await redis.xadd(keys.actor(actor).dead, '*', ...list, 'entry', entryId, 'error', String((error as Error).message))
      }
    }
    await options.beforeAck?.(actor, commandId)
    if (abandoned) return new Promise<never>(() => {})
    if (fields.reply) await reply(fields.reply, outcome ? { ask: fields.ask, result: outcome.result } : { ask: fields.ask, failed: true })
    await finish(redis, [mailbox], [mailboxGroup, entryId])
  }

  const readLoop = async () => {
    while (running) {
      try {
        const room = Math.max(1, concurrency - active.size - ready.size)
        const result = (await blocking.xreadgroup(
          'GROUP', hintGroup, id, 'COUNT', room, 'BLOCK', 1000, 'STREAMS', keys.actorsReady, '>',
        )) as [string, Entry[]][] | null
        for (const [hintId, fields] of result?.[0]?.[1] ?? []) {
          const actor = fields ? toRecord(fields).actor : undefined
          if (actor) hint(actor, hintId)
        }
        pump()
      } catch (error) {
        if (!running) return
        // Redis lost the stream or its group (a restart, a failover): make it again and go on.
        if (error instanceof Error && error.message.startsWith('NOGROUP')) await ensureHintGroup().catch(() => {})
        else log.warn('actor hint read failed', errorFields(error))
        await Bun.sleep(250)
      }
    }
  }

  // Hints a dead runtime read but never finished are taken over once they have sat long enough.
  let claimCursor = '0-0'
  const claimTimer = setInterval(async () => {
    try {
      const [next, entries] = (await redis.xautoclaim(
        keys.actorsReady, hintGroup, id, claimIdleMs, claimCursor, 'COUNT', 256,
      )) as [string, Entry[]]
      claimCursor = next
      for (const [hintId, fields] of entries) {
        const actor = fields ? toRecord(fields).actor : undefined
        if (actor) hint(actor, hintId)
        else await redis.xack(keys.actorsReady, hintGroup, hintId)
      }
      pump()
    } catch (error) {
      if (running) log.warn('actor hint claim failed', errorFields(error))
    }
  }, Math.max(250, Math.floor(claimIdleMs / 3)))

  // Mail whose hint was lost (Redis trimmed or lost the hint stream) is found by looking.
  const sweepTimer = setInterval(async () => {
    try {
      let cursor = '0'
      do {
        const [next, found] = await redis.scan(cursor, 'MATCH', keys.mailboxPattern, 'COUNT', 1000)
        cursor = next
        for (const mailbox of found) {
          const actor = mailbox.slice(mailbox.indexOf('{actor:') + 7, mailbox.lastIndexOf('}'))
          if (!active.has(actor) && (await redis.xlen(mailbox)) > 0) hint(actor, null)
        }
        pump()
      } while (cursor !== '0' && running)
    } catch (error) {
      if (running) log.warn('actor mailbox sweep failed', errorFields(error))
    }
  }, options.sweepEveryMs ?? 30_000)

  const reading = readLoop()

  return {
    id,
    stats: () => ({ ...stats }),
    async stop() {
      if (abandoned) return
      running = false
      clearInterval(claimTimer)
      clearInterval(sweepTimer)
      for (const timer of timers) clearTimeout(timer)
      blocking.disconnect()
      await reading
      await Promise.allSettled([...drains])
      // Hinted but never started: hand them on now rather than after the claim delay.
      const waiting = new Map([...ready].map(actor => [actor, 'interrupted' as Drain]))
      const taken = new Map([...ready].map(actor => [actor, [...(hints.get(actor) ?? [])]]))
      ready.clear()
      if (waiting.size > 0) await settle(waiting, taken)
      await repairs.close()
    },
    abandon() {
      running = false
      abandoned = true
      clearInterval(claimTimer)
      clearInterval(sweepTimer)
      for (const timer of timers) clearTimeout(timer)
      blocking.disconnect()
    },
  }
}

function commandIdOf(mail: Mail): string {
  return mail.fields.command || mail.entryId
}

function toRecord(list: string[]): Record<string, string> {
  const out: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]!] = list[i + 1]!
  return out
}

function ignoreBusyGroup(error: unknown) {
  if (!(error instanceof Error) || !error.message.startsWith('BUSYGROUP')) throw error
}
