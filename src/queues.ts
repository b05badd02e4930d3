/** The BullMQ queues the API adds jobs to; workers/ consumes them. One Redis connection for all producers. */
import { Queue } from 'bullmq'
import type { Config } from './config.ts'
import type { Keys } from './keys.ts'
import type { Log } from './log.ts'
import { closeRedis, createRedis, reportQueueErrors, type Redis } from './redis.ts'

/** Every queue's name; the blog slice adds to its own queue through src/blog/queue.ts. */
export const queueNames = { metering: 'metering', invoices: 'invoices', maintenance: 'maintenance', blog: 'blog' } as const

export interface Queues {
  metering: Queue
  invoices: Queue
  maintenance: Queue
  /**
   * Every queue of the service, for reading (their counts): the three above and the blog queue, which
   * the API adds to through deps.blogQueue (a connection that fails fast), not through this one.
   */
  all: Queue[]
  /** The producers' connection (BullMQ's kind: a command waits for Redis to come back). */
  connection: Redis
  close(): Promise<void>
}

export function createQueues(config: Config, keys: Keys, log: Log): Queues {
  const connection = createRedis(config.redisUrl, log, 'bullmq', 'queues')
  const options = { connection, prefix: keys.bullPrefix }
  const metering = new Queue(queueNames.metering, options)
  const invoices = new Queue(queueNames.invoices, options)
  const maintenance = new Queue(queueNames.maintenance, options)
  const blog = new Queue(queueNames.blog, options)
  const all = [metering, invoices, maintenance, blog]
  for (const queue of all) reportQueueErrors(queue, log, { queue: queue.name })
  return {
    metering,
    invoices,
    maintenance,
    all,
    connection,
    async close() {
      await Promise.all(all.map(queue => queue.close()))
      // With Redis away its commands (a scrape's counts, a schedule's upsert) wait for it: ended, not QUIT.
      await closeRedis(connection)
    },
  }
}
