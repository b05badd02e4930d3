/**
 * One REDIS_PREFIX, one deployment. Everything the service keeps in Redis lives under the prefix: the
 * actors' mailboxes and due set, the queues, the event streams, world chat. Two deployments on one
 * Redis under one prefix (staging beside production, both on the default) would apply each other's
 * commands to the wrong database and show each other's chat: each process claims the prefix for its
 * database's deployment id (migration 00022, kept through a dump, a restore or a failover) as it
 * boots, and refuses a prefix another deployment claimed.
 */
import type { Sql } from './db.ts'
import type { Redis } from './redis.ts'
import type { Keys } from './keys.ts'
import { errorFields, type Log } from './log.ts'

/**
 * Claims the prefix (or throws), and claims it again each time the connection is back: a Redis that
 * came back without its data (restarted empty, a replica that lagged promoted) is claimed at once by
 * the processes running on it, not by whichever deployment boots next. Found claimed by another
 * then, the process logs it and serves on (stopping would take the rightful deployment down).
 */
export async function holdRedisPrefix(sql: Sql, redis: Redis, keys: Keys, log: Log): Promise<void> {
  const ours = await deploymentId(sql)
  await claim(redis, keys, ours)
  redis.on('ready', () => {
    // Only another's claim is said: a claim Redis did not answer (paused, far) waits for the next reconnection.
    claim(redis, keys, ours).catch(error => {
      if (error instanceof PrefixClaimed) log.error('redis prefix not claimed again', errorFields(error))
    })
  })
}

/** Claims the prefix, or throws one line naming REDIS_PREFIX, both deployments and the way out. */
export async function claimRedisPrefix(sql: Sql, redis: Redis, keys: Keys): Promise<void> {
  await claim(redis, keys, await deploymentId(sql))
}

async function deploymentId(sql: Sql): Promise<string> {
  const [row] = await sql<{ id: string }[]>`select id from deployment`
  if (!row) throw new Error('the table deployment has no row (migration 00022 draws it): insert one, `insert into deployment default values`')
  return row.id
}

async function claim(redis: Redis, keys: Keys, ours: string): Promise<void> {
  let claimed: string | null = null
  // Unclaimed, or claimed by this deployment: done. (A claim deleted between the two asks is asked again.)
  while (claimed === null) {
    if ((await redis.set(keys.deployment, ours, 'NX')) === 'OK') return
    claimed = await redis.get(keys.deployment)
  }
  if (claimed === ours) return
  throw new PrefixClaimed(
    `REDIS_PREFIX=${keys.prefix} holds the Redis state of another deployment (its database's deployment id is ${claimed}; this one's is ${ours}): ` +
      `give each deployment a REDIS_PREFIX of its own. Where both ran on it before (its keys are this one's too), move the other ` +
      `to its own, then delete only the claim (redis-cli -u "$REDIS_URL" unlink '${keys.deployment}'); where only that one ran on it and is gone ` +
      `for good, delete its keys (redis-cli -u "$REDIS_URL" --scan --pattern '${keys.prefix}*' | xargs -r redis-cli -u "$REDIS_URL" unlink); then start again`,
  )
}

/** The prefix is another deployment's. */
class PrefixClaimed extends Error {}
