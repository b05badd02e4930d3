/**
 * Redis restarted under load, about 3 s down: once keeping its data (append-only file), once losing it
 * all; and Redis holding every write for 8 s (`CLIENT PAUSE ... WRITE`, as a managed service does
 * while it fails over, or an operator before a switch).
 */
import { Redis } from 'ioredis'
import { countUsageRecordedBefore } from './lib/deployment.ts'
import { describeScenario } from './lib/scenario.ts'
import { useWorld } from './lib/world.ts'

const servers = useWorld()

describeScenario('Redis restarted keeping its data', servers, {
  slug: 'redis-kept',
  async fault({ redis }) {
    const { downAt, upAt } = await redis.restart({ keepData: true, downMs: 3000 })
    return {
      label: 'Redis stopped (SIGTERM, its append-only file kept) and started again ~3 s later',
      restarted: 'Redis',
      upMeans: 'accepted connections',
      downAt,
      upAt,
    }
  },
})

describeScenario('Redis restarted losing its data', servers, {
  slug: 'redis-lost',
  async fault({ redis }, deployment) {
    const { downAt, upAt } = await redis.restart({ keepData: false, downMs: 3000 })
    // A proxy call answered just before the kill may have had its metering job lost with the data
    // (once in five runs here): its usage, recorded in Postgres before the answer, is maintenance's to count
    // a minute later. That pass is run here for what was recorded before the kill, rather than waited
    // for beyond the checks' patience; calls recorded since must be counted by their jobs.
    await countUsageRecordedBefore(deployment, downAt)
    return {
      label: 'Redis killed, its data deleted, and started again empty ~3 s later',
      restarted: 'Redis',
      upMeans: 'accepted connections',
      downAt,
      upAt,
    }
  },
})

const pauseMs = 8000

describeScenario('Redis holding writes', servers, {
  slug: 'redis-paused',
  async fault({ redis }) {
    const admin = new Redis(redis.url, { maxRetriesPerRequest: 1 })
    try {
      const downAt = Date.now()
      await admin.call('CLIENT', 'PAUSE', String(pauseMs), 'WRITE')
      await Bun.sleep(pauseMs)
      return {
        label: `Redis paused for writes (CLIENT PAUSE ${pauseMs} WRITE): reads answered, writes held`,
        restarted: 'Redis',
        upMeans: 'ended its pause',
        downAt,
        upAt: Date.now(),
      }
    } finally {
      admin.disconnect()
    }
  },
})
