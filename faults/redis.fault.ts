/** Redis restarted under load, about 3 s down: once keeping its data (append-only file), once losing it all. */
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
  async fault({ redis }) {
    const { downAt, upAt } = await redis.restart({ keepData: false, downMs: 3000 })
    return {
      label: 'Redis killed, its data deleted, and started again empty ~3 s later',
      restarted: 'Redis',
      upMeans: 'accepted connections',
      downAt,
      upAt,
    }
  },
})
