/** The service's memory through a phase: the API process's RSS, Redis's used_memory, and the bytes of the run's own Redis keys. */
import type { Redis } from 'ioredis'
import { memory, resetPeak } from './proc.ts'

export interface MemoryFigures {
  apiBeforeMb: number
  /** Peak RSS while watched (VmHWM after a reset, or samples every 100 ms where the reset is refused). */
  apiPeakMb: number
  redisBeforeMb: number
  /** Highest used_memory of the Redis server (every client's keys, not only the run's) sampled every 250 ms. */
  redisPeakMb: number
  /** The run's keys (the Redis prefix): MEMORY USAGE summed before and when the phase ended. */
  keysBefore: KeyBytes
  keysAfter: KeyBytes
}

export interface KeyBytes {
  keys: number
  mb: number
}

export interface MemoryWatch {
  stop(): Promise<MemoryFigures>
}

const MB = 1024 * 1024

export async function watchMemory(apiPid: number, redis: Redis, prefix: string): Promise<MemoryWatch> {
  const keysBefore = await prefixBytes(redis, prefix)
  const apiBeforeMb = memory(apiPid).rssMb
  const redisBeforeMb = await redisUsedMb(redis)
  const reset = resetPeak(apiPid)
  let apiPeakMb = apiBeforeMb
  let redisPeakMb = redisBeforeMb
  const rss = setInterval(() => {
    try {
      apiPeakMb = Math.max(apiPeakMb, memory(apiPid).rssMb)
    } catch {
      // exited: the phase fails when it is read at the end
    }
  }, 100)
  let sampling = Promise.resolve()
  const used = setInterval(() => {
    sampling = redisUsedMb(redis).then(
      mb => void (redisPeakMb = Math.max(redisPeakMb, mb)),
      () => {},
    )
  }, 250)
  return {
    async stop() {
      clearInterval(rss)
      clearInterval(used)
      await sampling
      const now = memory(apiPid)
      apiPeakMb = Math.max(apiPeakMb, now.rssMb, reset ? now.peakMb : 0)
      redisPeakMb = Math.max(redisPeakMb, await redisUsedMb(redis))
      return { apiBeforeMb, apiPeakMb, redisBeforeMb, redisPeakMb, keysBefore, keysAfter: await prefixBytes(redis, prefix) }
    },
  }
}

async function redisUsedMb(redis: Redis): Promise<number> {
  const info = await redis.info('memory')
  return Number(/^used_memory:(\d+)/m.exec(info)?.[1] ?? 0) / MB
}

/** How many keys start with `prefix` and what Redis says they take (MEMORY USAGE, all samples). */
export async function prefixBytes(redis: Redis, prefix: string): Promise<KeyBytes> {
  let cursor = '0'
  let keys = 0
  let bytes = 0
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
    cursor = next
    if (found.length === 0) continue
    const pipeline = redis.pipeline()
    for (const key of found) pipeline.call('memory', 'usage', key, 'samples', '0')
    for (const [error, size] of (await pipeline.exec()) ?? []) if (!error) bytes += Number(size ?? 0)
    keys += found.length
  } while (cursor !== '0')
  return { keys, mb: bytes / MB }
}
