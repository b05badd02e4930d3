/** Post logic: creation with a free slug, edits and moves between draft, scheduled and published. */
import type { Sql, TxSql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Config } from '../config.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { BlogQueue } from './queue.ts'
import type { MarkdownRenderer } from './render.ts'
import { uniqueViolation } from '../db.ts'
import { errors } from '../errors.ts'
import { parseTime } from '../http/schema.ts'
import type { Principal } from '../auth/principal.ts'
import { holdActiveAgent, type ParticipantRow } from '../participants/store.ts'
import type { CreatePost, PostStatus, UpdatePost } from './schema.ts'
import { candidatePrefix, firstFree, slugify } from './slug.ts'
import { deletePost, findPost, insertPost, livePlanVersion, takenSlugs, updatePost, type FullPostRow } from './store.ts'
import { announcePublished } from './publish.ts'
import { RendererBusy } from './render.ts'
import { requireBlogEnabled, requireWriter } from './writer.ts'

/** What writing posts uses. */
export interface PostDeps {
  sql: Sql
  clock: Clock
  config: Config
  rateLimiter: RateLimiter
  blogQueue: BlogQueue
  markdown: MarkdownRenderer
}

// With the agent's slugs taken one writer at a time, only a slug taken outside that order (none
// today) makes an attempt fail; five in a row is not a race.
const slugAttempts = 5

/**
 * Runs `write`, inside the caller's transaction, with the first free slug for `title`. The agent's
 * writers choose one at a time (a transaction-scoped advisory lock per agent), so thirty posts of
 * one title at once get `-2` to `-30` instead of failing on each other; should a slug still be taken
 * meanwhile, the unique index refuses it and the next one is tried.
 */
async function withFreeSlug<T>(
  sql: TxSql,
  post: { participantId: string; title: string; exceptPostId?: string },
  write: (slug: string) => Promise<T>,
): Promise<T> {
  await sql`select pg_advisory_xact_lock(hashtextextended(${`blog-slug:${post.participantId}`}, 0))`
  const base = slugify(post.title)
  for (let attempt = 1; ; attempt++) {
    const taken = await takenSlugs(sql, post.participantId, candidatePrefix(base), post.exceptPostId)
    try {
      return await write(firstFree(base, taken))
    } catch (error) {
      if (uniqueViolation(error) !== 'blog_posts_slug_per_agent') throw error
      if (attempt === slugAttempts) throw errors.unavailable('Could not reserve a slug for the post; try again')
    }
  }
}

// How far ahead a post may be scheduled; beyond it a time is far more likely a mistake than a plan.
const maxScheduleAheadMs = 366 * 86_400_000

/** A `publishAt` that must lie in the future: publishing by mistake cannot be taken back from readers. */
function futureTime(value: string | undefined, now: Date): Date | undefined {
  const at = parseTime(value, '/publishAt')
  if (at && at.getTime() <= now.getTime()) throw errors.field('/publishAt', 'must be in the future')
  if (at && at.getTime() - now.getTime() > maxScheduleAheadMs) throw errors.field('/publishAt', 'must be within 366 days')
  return at
}

const uniqueTags = (tags: string[] | undefined) => [...new Set(tags ?? [])]

/**
 * The content's HTML, rendered once now so that no reader's request has to; refused (503) if it
 * cannot be in time or the renderer fails. The writer's rate-limit token (`rule`) is taken first, so
 * concurrent requests cannot all reach the renderer on one token, and given back when the renderer
 * was too busy to try.
 */
async function renderContent(
  deps: Pick<PostDeps, 'markdown' | 'rateLimiter'>,
  content: string,
  limit: { rule: 'blogPostCreate' | 'blogContentEdit'; subject: string },
): Promise<string> {
  await deps.rateLimiter.take(limit.rule, limit.subject)
  let html: string | null
  try {
    html = await deps.markdown.render(content)
  } catch (error) {
    if (error instanceof RendererBusy) {
      await deps.rateLimiter.refund(limit.rule, limit.subject).catch(() => {})
      throw errors.unavailable('Too many posts are being rendered; try again shortly')
    }
    // Its thread failed (logged by the renderer; a broken deploy): nothing the writer can change.
    throw errors.unavailable('The renderer failed; try again shortly')
  }
  if (html === null) {
    throw errors.field(
      '/content',
      'is too complex to render: nested thousands deep, with tens of thousands of emphasis marks, or rendering to more than 2 MiB of HTML',
    )
  }
  return html
}

/**
 * Enqueues the job of the post's plan as the row says it now, and takes it out again when the plan is
 * no longer the row's or its agent is deactivated: a change committed meanwhile (a new time, a draft,
 * the post deleted, the agent deactivated) removes the job of the plan it replaced once it has
 * committed, which can be before this enqueue reached Redis; the job would then wait there, doing
 * nothing, until its time. Either that removal comes after this enqueue, or the change committed
 * before this read, which sees it.
 */
async function schedulePlan(deps: Pick<PostDeps, 'sql' | 'blogQueue'>, post: FullPostRow): Promise<void> {
  const job = { postId: post.id, version: post.scheduleVersion }
  await deps.blogQueue.schedule(job, post.publishAt!)
  if ((await livePlanVersion(deps.sql, post.id)) !== job.version) await deps.blogQueue.unschedule(job)
}

/** Where a new post starts: published now, scheduled (auto-publish is scheduled for now), or a draft. */
function initialState(body: CreatePost, autoPublish: boolean, now: Date): { status: PostStatus; publishAt: Date | null } {
  if (body.publish === true && body.publishAt !== undefined) {
    throw errors.field('/publishAt', 'give publish or publishAt, not both')
  }
  const publishAt = futureTime(body.publishAt, now)
  if (publishAt) return { status: 'scheduled', publishAt }
  if (body.publish === true) return { status: 'published', publishAt: null }
  // An explicit `publish: false` is a draft even when the agent auto-publishes.
  if (autoPublish && body.publish === undefined) return { status: 'scheduled', publishAt: now }
  return { status: 'draft', publishAt: null }
}

/**
 * Creates a post for an agent whose writer the caller already is; a scheduled one gets its job.
 * Counts against the agent's `blogPostCreate` limit once its fields are known to be valid, as its
 * content goes to the renderer (given back only if the renderer was too busy to try).
 */
export async function createPost(deps: PostDeps, agent: ParticipantRow, body: CreatePost): Promise<FullPostRow> {
  const { sql, clock } = deps
  requireBlogEnabled(agent)
  const now = clock.now()
  const { status, publishAt } = initialState(body, agent.blogAutoPublish, now)
  // Counted as the content goes to the renderer: content too complex to render counts as a post, a
  // renderer too busy with others' posts does not.
  const contentHtml = await renderContent(deps, body.content, { rule: 'blogPostCreate', subject: `agent:${agent.id}` })
  const post = await sql.begin(async tx => {
    // Held to the commit: a deactivation meanwhile is waited for, or went first and is seen.
    if (!(await holdActiveAgent(tx, agent.id))) throw errors.notFound('Participant')
    const id = await withFreeSlug(tx, { participantId: agent.id, title: body.title }, slug =>
      tx.savepoint(sp =>
        insertPost(sp, {
          participantId: agent.id,
          title: body.title,
          slug,
          content: body.content,
          contentHtml,
          excerpt: body.excerpt ?? null,
          tags: uniqueTags(body.tags),
          status,
          publishAt,
          at: now,
        }),
      ),
    )
    if (status === 'published') await announcePublished(tx, deps, now, [id])
    return (await findPost(tx, id))!
  })
  if (post.status === 'scheduled') await schedulePlan(deps, post)
  return post
}

/** The columns a state change writes; empty when the post already is where it is asked to go. */
function stateChanges(post: FullPostRow, body: UpdatePost, now: Date): Record<string, unknown> {
  // `scheduled` says what publishAt does; the other statuses contradict it.
  if (body.status === 'scheduled' && body.publishAt === undefined) throw errors.field('/publishAt', 'status scheduled needs publishAt')
  if (body.status !== undefined && body.status !== 'scheduled' && body.publishAt !== undefined) {
    throw errors.field('/publishAt', 'give status or publishAt, not both')
  }
  const publishAt = futureTime(body.publishAt, now)
  const nextVersion = post.scheduleVersion + 1
  if (publishAt) {
    if (post.status === 'published') {
      throw errors.field('/publishAt', 'the post is published; set status draft first to schedule it again')
    }
    return { status: 'scheduled', publish_at: publishAt, schedule_version: nextVersion }
  }
  if (body.status === 'published' && post.status !== 'published') {
    return {
      status: 'published',
      publish_at: null,
      published_at: now,
      first_published_at: post.firstPublishedAt ?? now,
      schedule_version: nextVersion,
    }
  }
  if (body.status === 'draft' && post.status !== 'draft') {
    return { status: 'draft', publish_at: null, published_at: null, schedule_version: nextVersion }
  }
  return {}
}

/** Applies a PATCH by a writer: fields, state, and the slug while the post has never been public. */
export async function changePost(deps: PostDeps, caller: Principal, postId: string, body: UpdatePost): Promise<FullPostRow> {
  const { sql, clock, blogQueue } = deps
  let contentHtml: string | undefined
  if (body.content !== undefined) {
    // Rendered before the transaction, which then holds no lock meanwhile; only for a writer, and
    // only for an edit whose state fields are valid (a refused edit does not count, as for a new post).
    const found = await findPost(sql, postId)
    if (!found) throw errors.notFound('Post')
    requireWriter(caller, found)
    requireBlogEnabled(found)
    stateChanges(found, body, clock.now())
    contentHtml = await renderContent(deps, body.content, { rule: 'blogContentEdit', subject: `agent:${found.participantId}` })
  }
  const now = clock.now()
  const { before, post } = await sql.begin(async tx => {
    // Locked, so the worker publishing this post waits for (or precedes) the decision made here.
    const post = await findPost(tx, postId, { lock: true })
    if (!post) throw errors.notFound('Post')
    requireWriter(caller, post)
    requireBlogEnabled(post)
    const changes: Record<string, unknown> = stateChanges(post, body, now)
    if (body.title !== undefined) changes.title = body.title
    if (body.content !== undefined) {
      changes.content = body.content
      changes.content_html = contentHtml
    }
    if (body.excerpt !== undefined) changes.excerpt = body.excerpt
    if (body.tags !== undefined) changes.tags = uniqueTags(body.tags)
    if (Object.keys(changes).length === 0) return { before: post, post }

    // Once a post has been public its address is out there: the slug stays whatever the title becomes.
    const slugFollows = body.title !== undefined && post.firstPublishedAt === null && slugify(body.title) !== slugify(post.title)
    if (slugFollows) {
      await withFreeSlug(tx, { participantId: post.participantId, title: body.title!, exceptPostId: post.id }, slug =>
        tx.savepoint(sp => updatePost(sp, post.id, { ...changes, slug }, now)),
      )
    } else {
      await updatePost(tx, post.id, changes, now)
    }
    if (changes.status === 'published') await announcePublished(tx, deps, now, [post.id])
    return { before: post, post: (await findPost(tx, post.id))! }
  })
  // Only a new publishAt makes a new plan; other edits leave the pending job valid.
  if (body.publishAt !== undefined && post.status === 'scheduled') {
    await schedulePlan(deps, post)
  }
  // The plan this change replaced had a job waiting for its time: without this, each new time a
  // writer sets would leave one more in Redis, for up to a year.
  if (before.status === 'scheduled' && before.scheduleVersion !== post.scheduleVersion) {
    await blogQueue.unschedule({ postId: post.id, version: before.scheduleVersion })
  }
  return post
}

/**
 * Deletes a post for a writer, and the pending publish job of the plan it had as it was deleted, not
 * as it was read: a change committed in between made a new plan, whose job would otherwise wait in
 * Redis until its time (it would find nothing to publish).
 */
export async function removePost(deps: Pick<PostDeps, 'sql' | 'blogQueue'>, caller: Principal, postId: string): Promise<void> {
  const post = await findPost(deps.sql, postId)
  if (!post) throw errors.notFound('Post')
  requireWriter(caller, post)
  requireBlogEnabled(post)
  const deleted = await deletePost(deps.sql, post.id)
  if (deleted?.status === 'scheduled') await deps.blogQueue.unschedule({ postId: post.id, version: deleted.scheduleVersion })
}
