/** The live count of a period's proxy calls in Redis, so a call's response shows usage including itself. */
import { defineScript, type Redis } from '../../redis.ts'
import type { Keys } from '../../keys.ts'
import type { DatabaseIdentity } from '../../db.ts'
import { idempotencyWindowMs } from '../../idempotency/idempotent.ts'

// KEYS[1] the period's counter, KEYS[2] the event's marker; ARGV seed (calls Postgres had counted), the
// counter's ttl ms, the marker's ttl ms.
// An event bumps the counter once, however often it is offered; a counter Redis lost restarts from the
// seed. A new event is answered no less than the seed and itself: a counter that restarted short of
// the calls whose jobs Redis lost with it would otherwise answer short for the rest of the period,
// after maintenance had counted them; a repeat, no less than the seed (which may hold it already).
// (The counter is not lifted: a call counted in Postgres before its own bump here would then be
// counted twice.)
const bump = defineScript(`
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) == false then
  return math.max(tonumber(redis.call('GET', KEYS[1]) or ARGV[1]), tonumber(ARGV[1]))
end
local calls = redis.call('INCR', KEYS[1])
if calls == 1 then calls = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1])) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return math.max(calls, tonumber(ARGV[1]) + 1)`)

/**
 * How long an event's marker is kept: an event is offered again only by a retry under its
 * Idempotency-Key, whose record lives 24 h. Kept as long as the counter (its period and a week), the
 * markers came to about 100 bytes a call for five weeks: 30 GB or more of Redis at 100 calls a second.
 */
const eventMarkerMs = 2 * idempotencyWindowMs

/** Where the live counts are kept: a counter belongs to the Postgres whose calls it counts (keys.ts). */
export interface CounterDeps {
  redis: Redis
  keys: Keys
  database: Pick<DatabaseIdentity, 'current'>
}

const counter = ({ keys, database }: CounterDeps, period: { subscriptionId: string; periodIndex: number }) =>
  keys.usage(period.subscriptionId, period.periodIndex, database.current() ?? '').calls

export async function countLive(
  deps: CounterDeps,
  event: { eventId: string; subscriptionId: string; periodIndex: number; seed: number; ttlMs: number },
): Promise<number> {
  return (await bump(
    deps.redis,
    [counter(deps, event), deps.keys.usageEvent(event.eventId)],
    [event.seed, event.ttlMs, Math.min(event.ttlMs, eventMarkerMs)],
  )) as number
}

/** The live counts of several periods (null where Redis has none). */
export async function liveCounts(deps: CounterDeps, periods: { subscriptionId: string; periodIndex: number }[]): Promise<(number | null)[]> {
  if (periods.length === 0) return []
  const values = await deps.redis.mget(...periods.map(p => counter(deps, p)))
  return values.map(value => (value === null ? null : Number(value)))
}
