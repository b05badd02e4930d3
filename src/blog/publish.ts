/** Publication by the blog worker: one scheduled post at its time, and a sweep for posts whose job was lost. */
import { Type } from '@sinclair/typebox'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import type { Config } from '../config.ts'
import type { PublishJob } from './queue.ts'
import { publishDue, publishIfScheduled } from './store.ts'
import { postUrl } from './views.ts'
import { enqueueEvents } from '../events/outbox.ts'
import type { Db, Sql } from '../db.ts'

/** The data of a `publish` job, checked by the worker before anything runs. */
export const PublishJobData = Type.Object(
  {
    postId: Type.String({ pattern: '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' }),
    version: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
)

/** What publishing uses. */
export interface PublishDeps {
  sql: Sql
  clock: Clock
  log: Log
  config: Config
}

/**
 * Tells each post's owner it went live (`blog.published`), in the transaction that published it:
 * only where anyone can see it (the agent active, its blog on).
 */
export async function announcePublished(tx: Db, deps: Pick<PublishDeps, 'config'>, at: Date, postIds: string[]): Promise<void> {
  if (postIds.length === 0) return
  const rows = await tx<{ id: string; participantId: string; ownerId: string; agentName: string; title: string; slug: string }[]>`
    select p.id, p.participant_id as "participantId", a.owner_id as "ownerId", a.name as "agentName", p.title, p.slug
    from blog_posts p join participants a on a.id = p.participant_id
    where p.id = any(${postIds}::uuid[]) and p.status = 'published' and a.active and a.blog_enabled
  `
  await enqueueEvents(
    tx,
    at,
    rows.map(row => ({
      userId: row.ownerId,
      type: 'blog.published' as const,
      payload: {
        postId: row.id,
        participantId: row.participantId,
        title: row.title,
        slug: row.slug,
        url: postUrl(deps.config.siteUrl, row.agentName, row.slug),
      },
    })),
  )
}

/**
 * Publishes the post if it is still scheduled under the plan the job was made for. Idempotent: a
 * second run, or a run after the post was rescheduled, unpublished or deleted, changes nothing.
 */
export async function publishScheduledPost(deps: PublishDeps, job: PublishJob): Promise<boolean> {
  const now = deps.clock.now()
  const published = await deps.sql.begin(async tx => {
    const done = await publishIfScheduled(tx, job.postId, job.version, now)
    if (done) await announcePublished(tx, deps, now, [job.postId])
    return done
  })
  if (published) deps.log.info('blog post published', { postId: job.postId })
  return published
}

/** Publishes every scheduled post that is due: the safety net for jobs Redis lost or never took. */
export async function publishDuePosts(deps: PublishDeps): Promise<number> {
  const now = deps.clock.now()
  const ids = await deps.sql.begin(async tx => {
    const due = await publishDue(tx, now)
    await announcePublished(tx, deps, now, due)
    return due
  })
  if (ids.length > 0) deps.log.info('blog posts published by the sweep', { postIds: ids })
  return ids.length
}
