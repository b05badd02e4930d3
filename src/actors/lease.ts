/** Actor leases: one holder at a time, renewed while it works, each hold with a fencing token. */
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'

// KEYS lease, fence; ARGV holder, ms. The token only grows, so a newer holder's is always larger.
const acquire = defineScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end
return false`)
const renew = defineScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)
const release = defineScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
// After Redis lost the fence counter, lift it past what Postgres has seen.
const raise = defineScript(`
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1`)

export interface LeaseDeps {
  redis: Redis
  keys: Keys
}

/** The fencing token of a new hold, or null when someone holds the actor. */
export async function acquireLease({ redis, keys }: LeaseDeps, actor: string, holder: string, ms: number): Promise<number | null> {
  const k = keys.actor(actor)
  const token = await acquire(redis, [k.lease, k.fence], [holder, ms])
  return token === null ? null : Number(token)
}

export async function renewLease({ redis, keys }: LeaseDeps, actor: string, holder: string, ms: number): Promise<boolean> {
  return (await renew(redis, [keys.actor(actor).lease], [holder, ms])) === 1
}

export async function releaseLease({ redis, keys }: LeaseDeps, actor: string, holder: string): Promise<void> {
  await release(redis, [keys.actor(actor).lease], [holder])
}

export async function raiseFence({ redis, keys }: LeaseDeps, actor: string, atLeast: number): Promise<void> {
  await raise(redis, [keys.actor(actor).fence], [atLeast])
}
