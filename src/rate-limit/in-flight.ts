/** Concurrency limits: how many of a subject's operations run at once, across every process, by leases in Redis. */
import { randomUUID } from 'node:crypto'
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errors } from '../errors.ts'

// KEYS[1] the subject's leases (id -> when it lapses, ms); ARGV now (ms), id, max, lease (ms).
// Lapsed leases (their process died, or never said it was done) are dropped before counting.
const enter = defineScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[4]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1`)

export interface InFlightRule {
  /** Names the limit in its Redis key. */
  name: string
  /** Operations of one subject that may run at once. */
  max: number
  /** How long an entry lasts if its operation never exits (its process died): longer than the operation can run. */
  leaseMs: number
}

export interface InFlightLimiter {
  /**
   * Counts one operation of `subject` as running, or throws 429 `rate_limited` with Retry-After when
   * `rule.max` already are; returns the exit, to call once it is done (it never throws).
   */
  enter(rule: InFlightRule, subject: string): Promise<() => Promise<void>>
}

/**
 * @example
 * const exit = await inFlight.enter({ name: 'proxyCall', max: 10, leaseMs: 30_000 }, `agent:${id}`)
 * try { await call() } finally { await exit() }
 */
export function createInFlightLimiter(redis: Redis, keys: Keys, clock: Clock): InFlightLimiter {
  return {
    async enter(rule, subject) {
      const key = keys.inFlight(rule.name, subject)
      const id = randomUUID()
      const admitted = await enter(redis, [key], [clock.now().getTime(), id, rule.max, rule.leaseMs])
      // Operations last seconds: one second is as good a guess of when a place frees up as any.
      if (admitted !== 1) throw errors.tooManyInFlight(1)
      return async () => {
        // Should Redis not take it, the lease lapses on its own.
        await redis.zrem(key, id).catch(() => {})
      }
    },
  }
}
