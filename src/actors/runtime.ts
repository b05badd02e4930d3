/**
 * The actor runtime: finds actors with mail through a shared hint stream, holds each one through a
 * renewed, fenced lease, and applies its commands one at a time, in order, exactly once in effect.
 */
import { randomUUID } from 'node:crypto'
import { isBadInput, isConnectionError, type Sql } from '../db.ts'
import { isRedisUnavailable, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log } from '../log.ts'
import { appliedCommand, claimCommand, enterFence, recordResult } from './store.ts'
import { acquireLease, raiseFence, releaseLease, renewLease } from './lease.ts'
import { isRefusal, type ActorKinds, type CommandContext } from './types.ts'

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
  /** Actors drained at once by this runtime. */
  concurrency?: number
  /** How often mailboxes are swept for mail whose hint was lost. */
  sweepEveryMs?: number
  /** Test seam: runs after a command's effect and projection, before it is acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

export interface ActorRuntime {
  readonly id: string
  /** Stops taking work, lets running commands finish, releases leases, hands unfinished actors on. */
  stop(): Promise<void>
  /** Stops dead, like a killed process: no release, no acknowledgement (for tests). */
  abandon(): void
}

const hintGroup = 'runtimes'
const mailboxGroup = 'actor'
// One consumer name for every holder: the next holder of an actor reads what the last one left unacknowledged.
const mailboxConsumer = 'holder'
const batch = 64
// A command that fails this often for a reason other than an outage goes to the dead-letter stream.
const maxAttempts = 5

type Entry = [id: string, fields: string[] | null]
type Drain = 'drained' | 'held' | 'interrupted'

/** Another holder took the actor over while this one was paused; stop at once. */
class FencedOut extends Error {}

function transient(error: unknown): boolean {
  const code = (error as { code?: string } | null)?.code
  return isConnectionError(error) || isRedisUnavailable(error) || code === '40001' || code === '40P01'
}

export async function startActorRuntime(options: ActorRuntimeOptions): Promise<ActorRuntime> {
  const { sql, redis, keys, kinds, clock, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  const claimIdleMs = options.claimIdleMs ?? leaseMs + 5000
  const concurrency = options.concurrency ?? 64
  const id = randomUUID()
  const blocking = redis.duplicate()

  let running = true
  let abandoned = false
  const active = new Set<string>()
  const again = new Set<string>()
  const hints = new Map<string, Set<string>>()
  const attempts = new Map<string, number>()
  const failures = new Map<string, number>()
  const drains = new Set<Promise<void>>()
  const timers = new Set<ReturnType<typeof setTimeout>>()
  let slots = concurrency
  const queue: (() => void)[] = []

  const ensureHintGroup = () => redis.xgroup('CREATE', keys.actorsReady, hintGroup, '0', 'MKSTREAM').catch(ignoreBusyGroup)
  await ensureHintGroup()

  const acquireSlot = () => (slots > 0 ? (slots--, Promise.resolve()) : new Promise<void>(resolve => queue.push(resolve)))
  const releaseSlot = () => {
    const next = queue.shift()
    if (next) next()
    else slots++
  }
  const later = (ms: number, fn: () => void) => {
    const timer = setTimeout(() => {
      timers.delete(timer)
      fn()
    }, ms)
    timers.add(timer)
  }
  const keep = (actor: string, ids: string[]) => {
    const set = hints.get(actor) ?? new Set<string>()
    for (const hintId of ids) set.add(hintId)
    hints.set(actor, set)
  }

  const hint = (actor: string, hintId: string | null) => {
    if (!running) return
    if (hintId) keep(actor, [hintId])
    if (active.has(actor)) {
      again.add(actor)
      return
    }
    active.add(actor)
    const run = (async () => {
      await acquireSlot()
      const taken = [...(hints.get(actor) ?? [])]
      hints.delete(actor)
      let outcome: Drain | 'failed'
      try {
        outcome = running ? await drain(actor) : 'interrupted'
      } catch (error) {
        outcome = 'failed'
        if (running) log.warn('actor drain failed; retrying', { actor, ...errorFields(error) })
      } finally {
        releaseSlot()
      }
      active.delete(actor)
      if (abandoned) return
      try {
        if (outcome === 'drained') {
          failures.delete(actor)
          if (taken.length > 0) await redis.xack(keys.actorsReady, hintGroup, ...taken)
          if (again.delete(actor)) hint(actor, null)
        } else if (outcome === 'interrupted') {
          // Stopping, or the lease moved on: leave a fresh hint so whoever runs next looks at it.
          await redis.xadd(keys.actorsReady, '*', 'actor', actor)
          if (taken.length > 0) await redis.xack(keys.actorsReady, hintGroup, ...taken)
        } else {
          // Held elsewhere (a dead holder never rechecks) or failing (an outage): keep the hints, retry later.
          keep(actor, taken)
          again.delete(actor)
          const failed = outcome === 'failed' ? (failures.get(actor) ?? 0) + 1 : 0
          if (failed > 0) failures.set(actor, failed)
          const delay = failed > 0 ? Math.min(30_000, 250 * 2 ** Math.min(failed, 7)) : leaseMs / 2
          later(delay, () => hint(actor, null))
        }
      } catch (error) {
        keep(actor, taken)
        log.warn('actor hint bookkeeping failed', { actor, ...errorFields(error) })
        later(1000, () => hint(actor, null))
      }
    })()
    drains.add(run)
    void run.finally(() => drains.delete(run))
  }

  /** Applies the actor's mail until its mailbox is empty. */
  const drain = async (actor: string): Promise<Drain> => {
    const { mailbox } = keys.actor(actor)
    for (let round = 0; ; round++) {
      const token = await acquireLease({ redis, keys }, actor, id, leaseMs)
      // Someone holds it. Another runtime looks at the mailbox again when it lets go.
      if (token === null) return round === 0 ? 'held' : 'drained'
      let lost = false
      const renewal = setInterval(() => {
        if (abandoned) return clearInterval(renewal)
        renewLease({ redis, keys }, actor, id, leaseMs).then(
          renewed => {
            if (!renewed) lost = true
          },
          () => {
            lost = true
          },
        )
      }, leaseMs / 3)
      let finished: boolean
      try {
        finished = await applyMailbox(actor, mailbox, token, () => lost || !running)
      } catch (error) {
        if (!(error instanceof FencedOut)) throw error
        finished = false
      } finally {
        clearInterval(renewal)
        if (!abandoned) await releaseLease({ redis, keys }, actor, id).catch(() => {})
      }
      if (!finished || lost) return 'interrupted'
      if ((await redis.xlen(mailbox)) === 0) return 'drained'
    }
  }

  /** True when the mailbox was read empty; false when stopped part way. */
  const applyMailbox = async (actor: string, mailbox: string, token: number, stopped: () => boolean) => {
    await redis.xgroup('CREATE', mailbox, mailboxGroup, '0', 'MKSTREAM').catch(ignoreBusyGroup)
    for (;;) {
      if (stopped()) return false
      // First what a previous holder read and never acknowledged (it may have died mid-command), then new mail.
      let entries = await readMailbox(mailbox, '0')
      if (entries.length === 0) entries = await readMailbox(mailbox, '>')
      if (entries.length === 0) return true
      for (const [entryId, fields] of entries) {
        if (stopped()) return false
        // Entries deleted while pending come back without fields: they were finished already.
        if (fields === null) await redis.xack(mailbox, mailboxGroup, entryId)
        else await applyEntry(actor, mailbox, entryId, fields, token)
      }
    }
  }

  const readMailbox = async (mailbox: string, from: string): Promise<Entry[]> => {
    const result = (await redis.xreadgroup(
      'GROUP', mailboxGroup, mailboxConsumer, 'COUNT', batch, 'STREAMS', mailbox, from,
    )) as [string, Entry[]][] | null
    return result?.[0]?.[1] ?? []
  }

  const applyEntry = async (actor: string, mailbox: string, entryId: string, list: string[], token: number) => {
    const fields = toRecord(list)
    const kind = actor.slice(0, actor.indexOf(':'))
    const handler = kinds[kind]?.[fields.type ?? '']
    const commandId = fields.command || entryId
    const attemptKey = `${actor} ${entryId}`
    let outcome: { result: unknown; project: boolean; context: CommandContext; payload: unknown } | undefined
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
          return { result, project: true, context, payload }
        }
        const previous = await appliedCommand(tx, actor, commandId)
        if (requestHash && previous?.requestHash && !previous.requestHash.equals(requestHash)) {
          return { result: { refused: 'idempotency_key_reused' }, project: false, context, payload }
        }
        // The same entry again means its holder died before acknowledging: finish its projection. Another
        // entry with an old command id is a repeat sent later; projecting it would undo newer state.
        return { result: previous?.result ?? null, project: previous?.entryId === entryId, context, payload }
      })
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
        await redis.xadd(keys.actor(actor).dead, '*', ...list, 'entry', entryId, 'error', String((error as Error).message))
      }
    }
    await options.beforeAck?.(actor, commandId)
    if (abandoned) return new Promise<never>(() => {})
    if (fields.reply) {
      const reply = outcome ? { ask: fields.ask, result: outcome.result } : { ask: fields.ask, failed: true }
      await redis.publish(fields.reply, JSON.stringify(reply))
    }
    await redis.multi().xack(mailbox, mailboxGroup, entryId).xdel(mailbox, entryId).exec()
  }

  const readLoop = async () => {
    while (running) {
      try {
        const result = (await blocking.xreadgroup(
          'GROUP', hintGroup, id, 'COUNT', Math.max(1, slots), 'BLOCK', 1000, 'STREAMS', keys.actorsReady, '>',
        )) as [string, Entry[]][] | null
        for (const [hintId, fields] of result?.[0]?.[1] ?? []) {
          const actor = fields ? toRecord(fields).actor : undefined
          if (actor) hint(actor, hintId)
        }
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
      } while (cursor !== '0' && running)
    } catch (error) {
      if (running) log.warn('actor mailbox sweep failed', errorFields(error))
    }
  }, options.sweepEveryMs ?? 30_000)

  const reading = readLoop()

  return {
    id,
    async stop() {
      if (abandoned) return
      running = false
      clearInterval(claimTimer)
      clearInterval(sweepTimer)
      for (const timer of timers) clearTimeout(timer)
      for (const release of queue.splice(0)) release()
      blocking.disconnect()
      await reading
      await Promise.allSettled([...drains])
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

function toRecord(list: string[]): Record<string, string> {
  const out: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]!] = list[i + 1]!
  return out
}

function ignoreBusyGroup(error: unknown) {
  if (!(error instanceof Error) || !error.message.startsWith('BUSYGROUP')) throw error
}
