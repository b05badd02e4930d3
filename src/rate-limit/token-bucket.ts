/** Rate limiting: a token bucket per (rule, subject) in Redis, refilled continuously, atomic by Lua. */
import { defineBatchedScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { RateLimitName, RateLimits } from '../config.ts'
import { errors } from '../errors.ts'

// K[1] bucket; A capacity, tokens per ms, now (ms), tokens needed, tokens taken (negative: given
// back, up to the capacity). Returns {allowed (0|1), ms until the tokens needed are there}. Batched:
// the buckets taken from in one tick (a reply's, a message's, each request's) share one EVALSHA.
const tokenBucket = defineBatchedScript(
  `
local capacity = tonumber(A[1])
local rate = tonumber(A[2])
local now = tonumber(A[3])
local need = tonumber(A[4])
local take = tonumber(A[5])
local state = redis.call('HMGET', K[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
if now > at then
  tokens = math.min(capacity, tokens + (now - at) * rate)
  at = now
end
if tokens >= need then
  tokens = math.min(capacity, tokens - take)
  redis.call('HSET', K[1], 'tokens', tostring(tokens), 'at', tostring(at))
  redis.call('PEXPIRE', K[1], math.ceil((capacity - tokens) / rate) + 1000)
  return {1, 0}
end
return {0, math.ceil((need - tokens) / rate)}`,
  1,
  5,
)

export interface RateLimiter {
  /** Takes one token or throws 429 `rate_limited` with Retry-After. */
  take(rule: RateLimitName, subject: string): Promise<void>
  /** Throws 429 when the bucket is empty, without taking anything. */
  check(rule: RateLimitName, subject: string): Promise<void>
  /** Gives a token taken back (the request it was taken for did nothing after all). */
  refund(rule: RateLimitName, subject: string): Promise<void>
  /**
   * Takes `tokens` whatever is left, into debt if it must: the cost of what was done, known only
   * once done (after a `check`). Later takes and checks are refused until the debt is refilled.
   */
  spend(rule: RateLimitName, subject: string, tokens: number): Promise<void>
}

export function createRateLimiter(redis: Redis, keys: Keys, clock: Clock, limits: RateLimits): RateLimiter {
  const run = async (rule: RateLimitName, subject: string, take: number, need = 1) => {
    const { capacity, perSeconds } = limits[rule]
    const rate = capacity / (perSeconds * 1000)
    const [allowed, waitMs] = (await tokenBucket(redis, [keys.rateLimit(rule, subject)], [capacity, rate, clock.now().getTime(), need, take])) as [
      number,
      number,
    ]
    if (allowed !== 1) throw errors.rateLimited(Math.max(1, Math.ceil(waitMs / 1000)))
  }
  return {
    take: (rule, subject) => run(rule, subject, 1),
    check: (rule, subject) => run(rule, subject, 0),
    refund: (rule, subject) => run(rule, subject, -1, 0),
    spend: (rule, subject, tokens) => run(rule, subject, tokens, 0),
  }
}
