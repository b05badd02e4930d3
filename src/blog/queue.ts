/** The `blog` BullMQ queue as the API uses it: one delayed job per post publication plan. */
import { Queue } from 'bullmq'
import { closeRedis, isRedisUnavailable, reportQueueErrors, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import { errorFields } from '../log.ts'
import { queueNames } from '../queues.ts'

export const blogQueueName = queueNames.blog

/** What a publish job carries: the post and the plan (schedule version) it was made for. */
export interface PublishJob {
  postId: string
  version: number
}

export interface BlogQueue {
  /**
   * Enqueues the publication of a post's current plan at `at` (now when past). Never throws: when
   * Redis refuses, the worker's periodic sweep publishes the post when it is due.
   */
  schedule(job: PublishJob, at: Date): Promise<void>
  /**
   * Removes the job of a plan that a later one replaced (a new time, a draft, a publication, the
   * post deleted), which would otherwise wait in Redis until its time, up to a year away. Never
   * throws: a job left behind (one already running, or Redis away) finds its plan stale and does
   * nothing. False when Redis could not be reached (an outage: the next removals would fail too).
   */
  unschedule(job: PublishJob): Promise<boolean>
  close(): Promise<void>
}

export function createBlogQueue(options: { redis: Redis; keys: Keys; clock: Clock; log: Log }): BlogQueue {
  const { redis, keys, clock, log } = options
  // A copy of the API's command connection, so an enqueue fails fast when Redis is gone instead of
  // hanging. A copy, not the connection itself: BullMQ defines its Lua scripts (64) on the connection it
  // is given, and ioredis copies every defined script onto each multi() and pipeline made from that
  // connection (about 20 µs each), which every inbox read and actor command paid.
  const connection = redis.duplicate({ connectionName: 'agent-marketplace:blog-queue' })
  const queue = new Queue<PublishJob>(blogQueueName, { connection, prefix: keys.bullPrefix })
  reportQueueErrors(queue, log, { queue: blogQueueName })
  return {
    async schedule(job, at) {
      try {
        await queue.add('publish', job, {
          jobId: jobId(job),
          delay: Math.max(0, at.getTime() - clock.now().getTime()),
          attempts: 5,
          backoff: { type: 'exponential', delay: 1000 },
          removeOnComplete: { age: 3600, count: 1000 },
          removeOnFail: { age: 7 * 86_400 },
        })
      } catch (error) {
        log.warn('blog publish job not enqueued; the sweep will publish it when due', { ...job, ...errorFields(error) })
      }
    },
    async unschedule(job) {
      try {
        await queue.remove(jobId(job))
        return true
      } catch (error) {
        log.warn('stale blog publish job not removed; it will find nothing to publish', { ...job, ...errorFields(error) })
        return !isRedisUnavailable(error)
      }
    },
    async close() {
      await queue.close()
      await closeRedis(connection)
    },
  }
}

/** One job per plan: a retried enqueue of the same plan is not a second job. */
function jobId(job: PublishJob): string {
  return `${job.postId}-${job.version}`
}
