/**
 * The in-process key cache: key hash -> principal, evicted on every instance by pub/sub on
 * revocation, and trusted only while pub/sub is: while this process's subscriber is away, every key
 * is checked in Postgres. A revocation also travels through the outbox (written by the revoking
 * statement, src/auth/store.ts), so it reaches every instance even when its own publish fails. The
 * cache is emptied when the pools reach another Postgres (a backup restored, a replica promoted),
 * which may lack a key the one before had.
 */
import type { DatabaseIdentity, Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { PubSub } from '../pubsub.ts'
import type { Log } from '../log.ts'
import type { Clock } from '../clock.ts'
import { errorFields } from '../log.ts'
import { findKeyStatus, touchKeys } from './store.ts'
import type { KeyStatus } from './principal.ts'

export interface KeyCache {
  /** What a key is by its hex SHA-256 (a live key's principal); from memory when possible, else one query. */
  lookup(hashHex: string): Promise<KeyStatus>
  /**
   * What memory holds, with no query: the key's status, or undefined when only `lookup` can tell.
   * Counts as a use of the key, as `lookup` does.
   */
  peek(hashHex: string): KeyStatus | undefined
  /**
   * Evicts keys here and, through Redis, at once on every other instance; a failed publish is logged
   * (the outbox relay announces the revocation again). Call after the revoking commit.
   */
  revoke(hashes: Buffer[]): Promise<void>
  /** Writes the buffered last-used times. */
  flushUsage(): Promise<void>
  close(): Promise<void>
}

export interface KeyCacheOptions {
  sql: Sql
  redis: Redis
  pubsub: PubSub
  channel: string
  clock: Clock
  log: Log
  database: Pick<DatabaseIdentity, 'onChange'>
  ttlMs?: number
  negativeTtlMs?: number
  maxEntries?: number
  flushEveryMs?: number
}

export async function createKeyCache(options: KeyCacheOptions): Promise<KeyCache> {
  const { sql, redis, pubsub, channel, clock, log } = options
  const ttlMs = options.ttlMs ?? 300_000
  const negativeTtlMs = options.negativeTtlMs ?? 30_000
  const maxEntries = options.maxEntries ?? 200_000
  // A key's use is written once a flush: with 100,000 agents polling, every 15 s cost Postgres 1.5
  // to 2.2 s of CPU each time (bench/notes.md); once a minute costs a quarter of that.
  const flushEveryMs = options.flushEveryMs ?? 60_000
  const entries = new Map<string, { status: KeyStatus; expires: number; usedIn: number }>()
  const pending = new Map<string, Promise<KeyStatus>>()
  const used = new Set<string>()
  // Bumped by every flush: an entry records its key's use once per flush, so that a poll touches only
  // the entry it already read, not `used` as well.
  let usageRound = 0
  // Bumped by every eviction: a lookup that started before one must not cache what it read.
  let epoch = 0

  const evict = (hex: string) => {
    epoch++
    entries.delete(hex)
    // A load in flight began before the revocation: later lookups must not join it.
    pending.delete(hex)
  }
  const unsubscribe = await pubsub.subscribe(channel, evict)
  const forgetAll = () => {
    epoch++
    entries.clear()
    // Loads begun before may have read a key revoked during the outage, or from the other database.
    pending.clear()
  }
  pubsub.onReconnect(forgetAll)
  options.database.onChange(forgetAll)

  const load = async (hex: string) => {
    const started = epoch
    const status = await findKeyStatus(sql, Buffer.from(hex, 'hex'))
    if (epoch === started && pubsub.listening()) {
      // A refreshed entry moves to the end; only a new one makes room, taking out the longest held.
      if (!entries.delete(hex) && entries.size >= maxEntries) {
        const oldest = entries.keys().next().value
        if (oldest !== undefined) entries.delete(oldest)
      }
      // Timed by the monotonic clock: a wall clock stepped back (NTP, a VM resumed) would keep it longer.
      entries.set(hex, { status, expires: performance.now() + (typeof status === 'object' ? ttlMs : negativeTtlMs), usedIn: -1 })
    }
    return status
  }

  const flushUsage = async () => {
    if (used.size === 0) return
    const ids = [...used]
    used.clear()
    usageRound++
    await touchKeys(sql, ids, clock.now(), flushEveryMs)
  }
  const timer = setInterval(() => {
    flushUsage().catch(error => log.warn('could not record key usage', errorFields(error)))
  }, flushEveryMs)
  timer.unref()

  return {
    peek(hex) {
      if (!pubsub.listening()) return undefined
      const hit = entries.get(hex)
      if (!hit || hit.expires <= performance.now()) return undefined
      if (hit.usedIn !== usageRound) {
        hit.usedIn = usageRound
        if (typeof hit.status === 'object' && hit.status.keyId) used.add(hit.status.keyId)
      }
      return hit.status
    },
    async lookup(hex) {
      const hit = entries.get(hex)
      let status: KeyStatus
      if (!pubsub.listening()) {
        // Evictions cannot reach this process now: what memory holds may have been revoked since.
        status = await findKeyStatus(sql, Buffer.from(hex, 'hex'))
      } else if (hit && hit.expires > performance.now()) {
        status = hit.status
      } else {
        let inflight = pending.get(hex)
        if (!inflight) {
          const started: Promise<KeyStatus> = load(hex).finally(() => {
            if (pending.get(hex) === started) pending.delete(hex)
          })
          inflight = started
          pending.set(hex, started)
        }
        status = await inflight
      }
      if (typeof status === 'object' && status.keyId) used.add(status.keyId)
      return status
    },
    async revoke(hashes) {
      const hexes = hashes.map(hash => hash.toString('hex'))
      for (const hex of hexes) evict(hex)
      try {
        await Promise.all(hexes.map(hex => redis.publish(channel, hex)))
      } catch (error) {
        log.warn('could not announce a key revocation; the outbox relay will', errorFields(error))
      }
    },
    flushUsage,
    async close() {
      clearInterval(timer)
      await unsubscribe()
      await flushUsage().catch(() => {})
    },
  }
}
