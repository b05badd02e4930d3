/**
 * Which actors have mail for a runtime to look at, and from when: a sorted set of actors by the time
 * they are due (Redis's clock), beside a hash of who marked each one last. Whoever leaves mail behind
 * marks its actor due at once: a sender as it appends (the mark behind the entry on one connection,
 * so it lands after it), and a holder that lets go with mail left. A runtime claims due actors
 * (marking them again, due a moment later, for the time it takes their leases) and takes a mark away or puts it off only
 * while it is still its own: one made since, by anyone, stays. So mail never waits unmarked, and a
 * process that dies leaves marks that come due for the others. A mark also rings a doorbell, a short
 * list an idle runtime waits on, so it looks at once rather than at its next round (every second
 * while idle).
 */
import { defineBatchedScript, defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'

const now = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`

// K due, due-by, wake; A actor. Due now, and nobody's: no runtime's settle takes the mark away.
const mark = defineBatchedScript(
  `${now}
redis.call('ZADD', K[1], 'LT', now, A[1])
redis.call('HSET', K[2], A[1], '')
redis.call('LPUSH', K[3], 1)
redis.call('LTRIM', K[3], 0, 15)
return 1`,
  3,
  1,
)

// K due, due-by; A actor, owner, in ms ('' takes the mark away). Only while the mark is the owner's.
const settle = defineBatchedScript(
  `${now}
if redis.call('HGET', K[2], A[1]) ~= A[2] then return 0 end
if A[3] == '' then
  redis.call('ZREM', K[1], A[1])
  redis.call('HDEL', K[2], A[1])
else
  redis.call('ZADD', K[1], now + tonumber(A[3]), A[1])
end
return 1`,
  2,
  3,
)

// KEYS due, due-by; ARGV count, ms, owner. The due actors, oldest first, each marked the owner's and
// due again in `ms`.
const claim = defineScript(`${now}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, actor in ipairs(due) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), actor)
  redis.call('HSET', KEYS[2], actor, ARGV[3])
end
return due`)

export interface Due {
  /** Marks the actor due at once, and rings the doorbell. */
  mark(actor: string): Promise<void>
  /** While the mark is still `owner`'s: takes it away (`inMs` undefined) or makes it due in `inMs`. */
  settle(actor: string, owner: string, inMs?: number): Promise<void>
  /** Up to `count` due actors, marked as `owner`'s and due again in `ms`. */
  claim(count: number, ms: number, owner: string): Promise<string[]>
  /** Waits on `blocking` (a connection of its own) until an actor is marked due at once, or `seconds` pass. */
  wait(blocking: Redis, seconds: number): Promise<void>
}

export function createDue(redis: Redis, keys: Keys): Due {
  const k = [keys.actorsDue, keys.actorsDueBy]
  return {
    async mark(actor) {
      await mark(redis, [...k, keys.actorsWake], [actor])
    },
    async settle(actor, owner, inMs) {
      await settle(redis, k, [actor, owner, inMs ?? ''])
    },
    async claim(count, ms, owner) {
      return (await claim(redis, k, [count, ms, owner])) as string[]
    },
    async wait(blocking, seconds) {
      await blocking.blpop(keys.actorsWake, seconds)
    },
  }
}
