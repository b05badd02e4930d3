/** The BullMQ queues the API adds jobs to; workers/ consumes them. One Redis connection for all producers. */
import { Queue } from 'bullmq'
import type { Config } from './config.ts'
import type { Keys } from './keys.ts'
import type { Log } from './log.ts'
import { createRedis, reportQueueErrors } from './redis.ts'

export const queueNames = { metering: 'metering', invoices: 'invoices', maintenance: 'maintenance' } as const

export interface Queues {
  metering: Queue
  invoices: Queue
  maintenance: Queue
  close(): Promise<void>
}

export function createQueues(config: Config, keys: Keys, log: Log): Queues {
  const connection = createRedis(config.redisUrl, log, 'bullmq', 'queues')
  const options = { connection, prefix: keys.bullPrefix }
  const metering = new Queue(queueNames.metering, options)
  const invoices = new Queue(queueNames.invoices, options)
  const maintenance = new Queue(queueNames.maintenance, options)
  for (const queue of [metering, invoices, maintenance]) reportQueueErrors(queue, log, { queue: queue.name })
  return {
    metering,
    invoices,
    maintenance,
    async close() {
      await Promise.all([metering.close(), invoices.close(), maintenance.close()])
      await connection.quit().catch(() => connection.disconnect())
    },
  }
}
