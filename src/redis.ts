/** Redis connections: commands (fail fast), a subscriber, and BullMQ's (which must wait forever). */
import { Redis } from 'ioredis'
import type { Log } from './log.ts'

export type { Redis }

export function createRedis(url: string, log: Log, role: 'commands' | 'subscriber' | 'bullmq'): Redis {
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 3000,
    // API calls fail fast (503) when Redis is gone; BullMQ requires null so its blocking calls wait.
    maxRetriesPerRequest: role === 'bullmq' ? null : 2,
    enableReadyCheck: true,
    connectionName: `agent-marketplace:${role}`,
  })
  let lastLogged = 0
  redis.on('error', error => {
    const now = Date.now()
    if (now - lastLogged < 5000) return
    lastLogged = now
    log.warn('redis connection error', { role, error: error.message })
  })
  return redis
}

/** Connects or throws a one-line error that says how to get Redis. */
export async function connectRedis(redis: Redis, url: string): Promise<void> {
  try {
    if (redis.status === 'wait') await redis.connect()
    await redis.ping()
  } catch {
    redis.disconnect()
    throw new Error(
      `Redis is not reachable at REDIS_URL=${redactUrl(url)}: start one (Debian: apt-get install redis-server && redis-server --daemonize yes) or point REDIS_URL at yours`,
    )
  }
}

export function redactUrl(url: string): string {
  return url.replace(/\/\/([^@/]*)@/, '//***@')
}

export function isRedisUnavailable(error: unknown): boolean {
  const e = error as { name?: string; message?: string } | null
  return (
    e?.name === 'MaxRetriesPerRequestError' ||
    /Connection is closed|ECONNREFUSED|Stream isn't writeable|enableOfflineQueue/.test(e?.message ?? '')
  )
}

/** Deletes every key under a prefix (a test's or a benchmark's own), by SCAN, never a flush. */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0'
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
    cursor = next
    if (found.length > 0) await redis.unlink(...found)
  } while (cursor !== '0')
}

export type Script = (redis: Redis, keys: string[], args: (string | number)[]) => Promise<unknown>

/** A Lua script run by its SHA (EVALSHA), loaded on first use and again after a Redis restart. */
export function defineScript(lua: string): Script {
  const sha = new Bun.CryptoHasher('sha1').update(lua).digest('hex')
  return async (redis, keys, args) => {
    try {
      return await redis.evalsha(sha, keys.length, ...keys, ...args)
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error
      return redis.eval(lua, keys.length, ...keys, ...args)
    }
  }
}
