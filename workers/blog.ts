/** The blog queue: `publish` jobs publish one scheduled post at its time; `sweep` catches any whose job was lost. */
import { UnrecoverableError, Worker, type Job } from 'bullmq'
import { Value } from '@sinclair/typebox/value'
import type { Deps } from '../src/deps.ts'
import type { Redis } from '../src/redis.ts'
import { blogQueueName } from '../src/blog/queue.ts'
import { PublishJobData, publishDuePosts, publishScheduledPost } from '../src/blog/publish.ts'

// How late a due post whose job was lost (with Redis's data, or never queued) goes live at most:
// well within the 5 s an auto-published post is promised.
export const blogSweepEveryMs = 2_000

export async function runBlogJob(deps: Deps, job: Job): Promise<unknown> {
  if (job.name === 'sweep') return publishDuePosts(deps)
  if (job.name !== 'publish' || !Value.Check(PublishJobData, job.data)) {
    throw new UnrecoverableError(`not a blog job: ${job.name}`)
  }
  return publishScheduledPost(deps, job.data)
}

/** The blog worker on a BullMQ connection (maxRetriesPerRequest null) with the deps' queue prefix. */
export function blogWorker(deps: Deps, connection: Redis): Worker {
  return new Worker(blogQueueName, job => runBlogJob(deps, job), {
    connection,
    prefix: deps.keys.bullPrefix,
    concurrency: 4,
  })
}
