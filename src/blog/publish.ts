/** Publication by the blog worker: one scheduled post at its time, and a sweep for posts whose job was lost. */
import { Type } from '@sinclair/typebox'
import type { Deps } from '../deps.ts'
import type { PublishJob } from './queue.ts'
import { publishDue, publishIfScheduled } from './store.ts'

/** The data of a `publish` job, checked by the worker before anything runs. */
export const PublishJobData = Type.Object(
  {
    postId: Type.String({ pattern: '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' }),
    version: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
)

type PublishDeps = Pick<Deps, 'sql' | 'clock' | 'log'>

/**
 * Publishes the post if it is still scheduled under the plan the job was made for. Idempotent: a
 * second run, or a run after the post was rescheduled, unpublished or deleted, changes nothing.
 */
export async function publishScheduledPost({ sql, clock, log }: PublishDeps, job: PublishJob): Promise<boolean> {
  const published = await publishIfScheduled(sql, job.postId, job.version, clock.now())
  if (published) log.info('blog post published', { postId: job.postId })
  return published
}

/** Publishes every scheduled post that is due: the safety net for jobs Redis lost or never took. */
export async function publishDuePosts({ sql, clock, log }: PublishDeps): Promise<number> {
  const ids = await publishDue(sql, clock.now())
  if (ids.length > 0) log.info('blog posts published by the sweep', { postIds: ids })
  return ids.length
}
