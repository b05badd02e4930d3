/**
 * The actor runtime: learns of actors with mail from hints (hints.ts), works them in batches of turns
 * on their mail (mail.ts), each actor's batches one after another (the batcher), and keeps the hints'
 * books: acknowledged once an actor is drained, kept and tried later while it is held elsewhere or
 * failing, handed on to the other runtimes when it stops.
 */
import { randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errorFields, type Log } from '../log.ts'
import { createBatcher } from '../batcher.ts'
import type { ActorKinds } from './types.ts'
import { createHolder } from './hold.ts'
import { createMailTurns, type Drain, type MailStats } from './mail.ts'
import { acknowledgeHints, hintRuntimes, startHintIntake } from './hints.ts'
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

export type ActorRuntimeStats = MailStats

export interface ActorRuntime {
  readonly id: string
  /** Counters since the start, for metrics and tests. */
  stats(): ActorRuntimeStats
  /** Stops taking work, lets running commands finish, releases leases, hands unfinished actors on. */
  stop(): Promise<void>
  /** Stops dead, like a killed process: no release, no acknowledgement (for tests). */
  abandon(): void
}

export async function startActorRuntime(options: ActorRuntimeOptions): Promise<ActorRuntime> {
  const { redis, keys, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  const concurrency = options.concurrency ?? 256
  const batches = options.batches ?? 2
  const id = randomUUID()
  const holder = createHolder(redis, keys, id, leaseMs)
  const repairs = createRepairs(log)
  let running = true
  let abandoned = false
  const turns = createMailTurns({
    ...options,
    leaseMs,
    repairs,
    holder,
    running: () => running,
    abandoned: () => abandoned,
  })
  const failures = new Map<string, number>()
  const timers = new Set<ReturnType<typeof setTimeout>>()
  const later = (ms: number, actor: string, ids: string[]) => {
    // Stopping: the hints stay unacknowledged, for another runtime to take over.
    if (!running) return
    const timer = setTimeout(() => {
      timers.delete(timer)
      requeue(actor, ids)
    }, ms)
    timers.add(timer)
  }

  const batcher = createBatcher<string | null>({
    slots: batches,
    maxKeys: Math.max(1, Math.min(options.batchActors ?? 64, Math.floor(concurrency / batches))),
    run: async batch => {
      const outcomes = await turns.work([...batch.keys()]).catch(error => {
        // Taking the leases failed (Redis is away): nothing was taken, try again later.
        if (running) log.warn('actor batch failed; retrying', { actors: batch.size, ...errorFields(error) })
        return new Map([...batch.keys()].map(actor => [actor, 'failed' as Drain]))
      })
      if (!abandoned) await settle(outcomes, batch)
    },
  })
  const requeue = (actor: string, ids: string[]) => {
    if (!running) return
    if (ids.length === 0) batcher.add(actor, null)
    for (const hintId of ids) batcher.add(actor, hintId)
  }

  /** The hints' books after a batch. */
  const settle = async (outcomes: Map<string, Drain>, batch: Map<string, (string | null)[]>) => {
    const acknowledge: string[] = []
    const handOn: string[] = []
    for (const [actor, drained] of outcomes) {
      const ids = (batch.get(actor) ?? []).filter(hintId => hintId !== null)
      // Stopping with mail left: hand the actor on.
      const outcome = !running && drained === 'more' ? 'interrupted' : drained
      if (outcome === 'drained' || outcome === 'interrupted') {
        failures.delete(actor)
        acknowledge.push(...ids)
        // The lease moved on, or this runtime stops: a fresh hint makes whoever runs next look at it.
        if (outcome === 'interrupted') handOn.push(actor)
      } else if (outcome === 'more') {
        failures.delete(actor)
        requeue(actor, ids)
      } else {
        // Held elsewhere (a dead holder never rechecks) or failing (an outage): keep the hints, retry later.
        if (outcome === 'held') turns.forget(actor)
        const failed = outcome === 'failed' ? (failures.get(actor) ?? 0) + 1 : 0
        if (failed > 0) failures.set(actor, failed)
        later(failed > 0 ? Math.min(30_000, 250 * 2 ** Math.min(failed, 7)) : leaseMs / 2, actor, ids)
      }
    }
    try {
      await Promise.all([...handOn.map(actor => hintRuntimes(redis, keys, actor)), acknowledgeHints(redis, keys, acknowledge)])
    } catch (error) {
      log.warn('actor hint bookkeeping failed', { actors: outcomes.size, ...errorFields(error) })
      for (const actor of handOn) later(1000, actor, [])
    }
  }

  const intake = await startHintIntake({
    redis,
    keys,
    log,
    id,
    claimIdleMs: options.claimIdleMs ?? leaseMs + 5000,
    sweepEveryMs: options.sweepEveryMs ?? 30_000,
    room: concurrency,
    hint: (actor, hintId) => requeue(actor, hintId ? [hintId] : []),
  })

  const halt = () => {
    running = false
    for (const timer of timers) clearTimeout(timer)
  }
  return {
    id,
    stats: turns.stats,
    async stop() {
      if (abandoned) return
      halt()
      await intake.stop()
      // Hinted but never started: hand them on now rather than after the claim delay.
      const waiting = batcher.clear()
      await batcher.drain()
      if (waiting.size > 0) await settle(new Map([...waiting.keys()].map(actor => [actor, 'interrupted'])), waiting)
      await repairs.close()
    },
    abandon() {
      abandoned = true
      holder.abandon()
      halt()
      void intake.stop()
    },
  }
}
