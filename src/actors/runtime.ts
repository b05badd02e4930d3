/**
 * The actor runtime: finds actors with mail through a shared hint stream, holds each one through a
 * renewed lease, and applies its commands one at a time, in order, exactly once in effect.
 */
import { randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log } from '../log.ts'
import { appliedCommand, claimCommand, recordResult } from './store.ts'
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
  /** Test seam: runs after a command's effect and projection, before it is acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

export interface ActorRuntime {
  readonly id: string
  /** Stops taking work, lets running commands finish, releases leases. */
  stop(): Promise<void>
  /** Stops dead, like a killed process: no release, no acknowledgement (for tests). */
  abandon(): void
}

const hintGroup = 'runtimes'
const mailboxGroup = 'actor'
// One consumer name for every holder: the next holder of an actor reads what the last one left unacknowledged.
const mailboxConsumer = 'holder'
const batch = 64
const maxAttempts = 5

const renewLease = defineScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)
const releaseLease = defineScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

type Entry = [id: string, fields: string[]]

export async function startActorRuntime(options: ActorRuntimeOptions): Promise<ActorRuntime> {
  const { sql, redis, keys, kinds, clock, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  const claimIdleMs = options.claimIdleMs ?? leaseMs * 3
  const concurrency = options.concurrency ?? 64
  const id = randomUUID()
  const blocking = redis.duplicate()

  let running = true
  let abandoned = false
  const active = new Set<string>()
  const again = new Set<string>()
  const hints = new Map<string, string[]>()
  const attempts = new Map<string, number>()
  const drains = new Set<Promise<void>>()
  const timers = new Set<ReturnType<typeof setTimeout>>()
  let slots = concurrency
  const queue: (() => void)[] = []

  await redis.xgroup('CREATE', keys.actorsReady, hintGroup, '0', 'MKSTREAM').catch(ignoreBusyGroup)

  const acquireSlot = () =>
    slots > 0 ? (slots--, Promise.resolve()) : new Promise<void>(resolve => queue.push(resolve))
  const releaseSlot = () => {
    const next = queue.shift()
    if (next) next()
    else slots++
  }

  const hint = (actor: string, hintId: string | null) => {
    if (!running) return
    if (hintId) hints.set(actor, [...(hints.get(actor) ?? []), hintId])
    if (active.has(actor)) {
      again.add(actor)
      return
    }
    active.add(actor)
    const run = (async () => {
      const taken = hints.get(actor) ?? []
      hints.delete(actor)
      await acquireSlot()
      const retry = (ms: number) => {
        hints.set(actor, [...taken, ...(hints.get(actor) ?? [])])
        const timer = setTimeout(() => {
          timers.delete(timer)
          hint(actor, null)
        }, ms)
        timers.add(timer)
      }
      try {
        if (await drain(actor)) {
          if (taken.length > 0 && !abandoned) await redis.xack(keys.actorsReady, hintGroup, ...taken)
        } else if (running) {
          // Held elsewhere. A live holder looks at the mailbox again after releasing; a dead one never
          // will, so keep the hints and try again once its lease could have run out.
          retry(leaseMs / 2)
        }
      } catch (error) {
        if (!running) return
        // Transient (the database or Redis is away): keep the hints and try the actor again shortly.
        log.warn('actor drain failed; retrying', { actor, ...errorFields(error) })
        retry(500)
      } finally {
        releaseSlot()
        active.delete(actor)
        if (again.delete(actor)) hint(actor, null)
      }
    })()
    drains.add(run)
    void run.finally(() => drains.delete(run))
  }

  /** Applies the actor's mail until its mailbox is empty; false when another runtime holds the actor. */
  const drain = async (actor: string): Promise<boolean> => {
    const { lease, mailbox } = keys.actor(actor)
    for (let round = 0; ; round++) {
      const taken = await redis.set(lease, id, 'PX', leaseMs, 'NX')
      if (taken !== 'OK') return round > 0
      let lost = false
      const renewal = setInterval(() => {
        if (abandoned) return clearInterval(renewal)
        renewLease(redis, [lease], [id, leaseMs]).then(
          renewed => {
            if (renewed !== 1) lost = true
          },
          () => {
            lost = true
          },
        )
      }, leaseMs / 3)
      try {
        await applyMailbox(actor, mailbox, () => lost || !running)
      } finally {
        clearInterval(renewal)
        if (!abandoned) await releaseLease(redis, [lease], [id]).catch(() => {})
      }
      if (lost || !running || abandoned) return true
      if ((await redis.xlen(mailbox)) === 0) return true
    }
  }

  const applyMailbox = async (actor: string, mailbox: string, stopped: () => boolean) => {
    await redis.xgroup('CREATE', mailbox, mailboxGroup, '0', 'MKSTREAM').catch(ignoreBusyGroup)
    for (;;) {
      // First what a previous holder read and never acknowledged (it may have died mid-command), then new mail.
      let redelivered = true
      let entries = await readMailbox(mailbox, '0')
      if (entries.length === 0) {
        redelivered = false
        entries = await readMailbox(mailbox, '>')
      }
      if (entries.length === 0) return
      for (const [entryId, fields] of entries) {
        if (stopped()) return
        await applyEntry(actor, mailbox, entryId, fields, redelivered)
      }
    }
  }

  const readMailbox = async (mailbox: string, from: string): Promise<Entry[]> => {
    const result = (await redis.xreadgroup(
      'GROUP', mailboxGroup, mailboxConsumer, 'COUNT', batch, 'STREAMS', mailbox, from,
    )) as [string, Entry[]][] | null
    // Entries deleted while pending come back with null fields; they were finished already.
    return (result?.[0]?.[1] ?? []).filter(([, fields]) => fields !== null)
  }

  const applyEntry = async (actor: string, mailbox: string, entryId: string, list: string[], redelivered: boolean) => {
    const fields = toRecord(list)
    const kind = actor.slice(0, actor.indexOf(':'))
    const handler = kinds[kind]?.[fields.type ?? '']
    const context: CommandContext = { actor, id: actor.slice(kind.length + 1), commandId: fields.command ?? entryId, at: clock.now() }
    let outcome: { result: unknown; fresh: boolean } | undefined
    try {
      if (!handler) throw new Error(`no handler for ${kind} command ${fields.type}`)
      const payload = JSON.parse(fields.payload ?? 'null')
      const requestHash = fields.hash ? Buffer.from(fields.hash, 'hex') : null
      outcome = await sql.begin(async tx => {
        if (await claimCommand(tx, { actor, commandId: context.commandId, requestHash, at: context.at })) {
          const result = await handler.apply(tx, payload, context)
          await recordResult(tx, actor, context.commandId, result)
          return { result, fresh: true }
        }
        const previous = await appliedCommand(tx, actor, context.commandId)
        if (requestHash && previous?.requestHash && !previous.requestHash.equals(requestHash)) {
          return { result: { refused: 'idempotency_key_reused' }, fresh: false }
        }
        return { result: previous?.result ?? null, fresh: false }
      })
      // A repeat sent later (same command id) must not replay an old projection over newer state;
      // a redelivery after a crash is the newest command of this actor, so its projection is safe.
      if ((outcome.fresh || redelivered) && !isRefusal(outcome.result)) {
        await handler.project?.(outcome.result, payload, context)
      }
      attempts.delete(entryId)
    } catch (error) {
      const count = (attempts.get(entryId) ?? 0) + 1
      attempts.set(entryId, count)
      if (count < maxAttempts) throw error
      attempts.delete(entryId)
      log.error('actor command dropped after repeated failures', { actor, type: fields.type, entryId, ...errorFields(error) })
    }
    await options.beforeAck?.(actor, context.commandId)
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
          'GROUP', hintGroup, id, 'COUNT', 256, 'BLOCK', 1000, 'STREAMS', keys.actorsReady, '>',
        )) as [string, Entry[]][] | null
        for (const [hintId, fields] of result?.[0]?.[1] ?? []) {
          const actor = toRecord(fields).actor
          if (actor) hint(actor, hintId)
        }
      } catch (error) {
        if (!running) return
        log.warn('actor hint read failed', errorFields(error))
        await sleep(500)
      }
    }
  }

  // Hints a dead runtime read but never finished are taken over once they have sat long enough.
  const claimTimer = setInterval(async () => {
    try {
      const [, entries] = (await redis.xautoclaim(keys.actorsReady, hintGroup, id, claimIdleMs, '0-0', 'COUNT', 256)) as [
        string,
        Entry[],
      ]
      for (const [hintId, fields] of entries) {
        const actor = fields ? toRecord(fields).actor : undefined
        if (actor) hint(actor, hintId)
        else await redis.xack(keys.actorsReady, hintGroup, hintId)
      }
    } catch (error) {
      if (running) log.warn('actor hint claim failed', errorFields(error))
    }
  }, Math.max(250, Math.floor(claimIdleMs / 2)))

  const reading = readLoop()

  return {
    id,
    async stop() {
      if (abandoned) return
      running = false
      clearInterval(claimTimer)
      for (const timer of timers) clearTimeout(timer)
      blocking.disconnect()
      await reading
      await Promise.allSettled([...drains])
    },
    abandon() {
      running = false
      abandoned = true
      clearInterval(claimTimer)
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

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms))
