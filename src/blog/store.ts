/** SQL for blog posts: writes, the writers' list, the public lists, and publication by the worker. */
import type { Db } from '../db.ts'
import { findParticipant, type ParticipantRow } from '../participants/store.ts'
import type { PostStatus } from './schema.ts'

export interface PostRow {
  id: string
  participantId: string
  agentName: string
  agentDisplayName: string
  ownerId: string
  blogEnabled: boolean
  title: string
  slug: string
  excerpt: string | null
  tags: string[]
  status: PostStatus
  publishAt: Date | null
  publishedAt: Date | null
  firstPublishedAt: Date | null
  scheduleVersion: number
  viewCount: number
  createdAt: Date
  updatedAt: Date
}

export interface FullPostRow extends PostRow {
  content: string
}

/** A post as pages and feeds read it. */
export interface PostWithHtml extends FullPostRow {
  /** The content rendered when it was written; null for a post written before that was done. */
  contentHtml: string | null
}

/**
 * The columns of a post and its agent; `p` is the post, `a` the agent. With its content, and for
 * pages and feeds also the HTML (which only they read: it doubles a row's text).
 */
const columns = (sql: Db, withContent: boolean | 'html') => sql`
  p.id, p.participant_id as "participantId", a.name as "agentName", a.display_name as "agentDisplayName",
  a.owner_id as "ownerId", a.blog_enabled as "blogEnabled", p.title, p.slug, p.excerpt, p.tags, p.status,
  p.publish_at as "publishAt", p.published_at as "publishedAt", p.first_published_at as "firstPublishedAt",
  p.schedule_version as "scheduleVersion", p.view_count as "viewCount",
  p.created_at as "createdAt", p.updated_at as "updatedAt"
  ${withContent ? sql`, p.content` : sql``}
  ${withContent === 'html' ? sql`, p.content_html as "contentHtml"` : sql``}
`

export interface NewPost {
  participantId: string
  title: string
  slug: string
  content: string
  contentHtml: string
  excerpt: string | null
  tags: string[]
  status: PostStatus
  publishAt: Date | null
  at: Date
}

/**
 * Inserts a post; a taken slug fails with the unique violation `blog_posts_slug_per_agent`. The caller
 * holds the agent's slug lock (withFreeSlug), so each post is dated at least a millisecond after the
 * agent's newest: the writers' list, paged by `before` (strictly older), then skips none of posts
 * written at once.
 */
export async function insertPost(sql: Db, post: NewPost): Promise<string> {
  const published = post.status === 'published'
  const [row] = await sql<{ id: string }[]>`
    with dated as (
      select greatest(
        ${post.at}::timestamptz,
        (select max(created_at) from blog_posts where participant_id = ${post.participantId}) + interval '1 millisecond'
      ) as at
    )
    insert into blog_posts (
      participant_id, title, slug, content, content_html, excerpt, tags, status, publish_at, published_at,
      first_published_at, created_at, updated_at
    )
    select
      ${post.participantId}, ${post.title}, ${post.slug}, ${post.content}, ${post.contentHtml}, ${post.excerpt},
      ${post.tags}::text[], ${post.status}, ${post.publishAt}::timestamptz,
      case when ${published}::boolean then dated.at end, case when ${published}::boolean then dated.at end,
      dated.at, dated.at
    from dated
    returning id
  `
  return row!.id
}

/** The agent's slugs that start with `prefix`, except the post's own. */
export async function takenSlugs(sql: Db, participantId: string, prefix: string, exceptPostId?: string): Promise<Set<string>> {
  // Slugs hold only a-z, 0-9 and '-', so the prefix needs no escaping for like.
  const rows = await sql<{ slug: string }[]>`
    select slug from blog_posts
    where participant_id = ${participantId} and slug like ${`${prefix}%`}
      and id is distinct from ${exceptPostId ?? null}::uuid
  `
  return new Set(rows.map(row => row.slug))
}

/**
 * A post of an active agent, whatever its status. With `lock`, the post's row is locked and its
 * agent's held (key share) in one statement: a deactivation in flight, or one committed while the
 * post's row was waited for, is seen, and then there is no post.
 */
export async function findPost(sql: Db, id: string, options: { lock?: boolean } = {}): Promise<FullPostRow | undefined> {
  const [row] = await sql<FullPostRow[]>`
    select ${columns(sql, true)}
    from blog_posts p join participants a on a.id = p.participant_id
    where p.id = ${id} and a.active
    ${options.lock ? sql`for update of p for key share of a` : sql``}
  `
  return row
}

/** Writes the given columns (snake_case) and updated_at. */
export async function updatePost(sql: Db, id: string, changes: Record<string, unknown>, at: Date): Promise<void> {
  await sql`update blog_posts set ${sql(changes)}, updated_at = ${at} where id = ${id}`
}

/** Keeps the HTML of a post written before content was rendered at write time, unless it changed meanwhile. */
export async function storeContentHtml(sql: Db, post: { id: string; content: string }, html: string): Promise<void> {
  await sql`update blog_posts set content_html = ${html} where id = ${post.id} and content = ${post.content}`
}

/** The post's plan number (schedule_version) while its agent is active; undefined once it is deleted or its agent deactivated. */
export async function livePlanVersion(sql: Db, id: string): Promise<number | undefined> {
  const [row] = await sql<{ version: number }[]>`
    select p.schedule_version as version from blog_posts p join participants a on a.id = p.participant_id
    where p.id = ${id} and a.active
  `
  return row?.version
}

/** Deletes a post; its status and plan number as it was deleted, undefined when it was gone already. */
export async function deletePost(sql: Db, id: string): Promise<{ status: PostStatus; scheduleVersion: number } | undefined> {
  const [row] = await sql<{ status: PostStatus; scheduleVersion: number }[]>`
    delete from blog_posts where id = ${id} returning status, schedule_version as "scheduleVersion"
  `
  return row
}

/** Every post of one agent for its writers, newest first. */
export async function listAgentPosts(
  sql: Db,
  participantId: string,
  page: { limit: number; status: PostStatus | undefined; before: Date | undefined },
): Promise<PostRow[]> {
  return sql<PostRow[]>`
    select ${columns(sql, false)}
    from blog_posts p join participants a on a.id = p.participant_id
    where p.participant_id = ${participantId}
      ${page.status ? sql`and p.status = ${page.status}` : sql``}
      ${page.before ? sql`and p.created_at < ${page.before}` : sql``}
    order by p.created_at desc, p.id desc
    limit ${page.limit}
  `
}

/** Where a post can be seen by anyone: published, by an active agent whose blog is on. */
const visible = (sql: Db) => sql`p.status = 'published' and a.active and a.blog_enabled`

/** An agent whose blog anyone may read: active, and opted in. */
export async function findPublicBlog(sql: Db, idOrName: string): Promise<ParticipantRow | undefined> {
  const agent = await findParticipant(sql, idOrName)
  return agent?.blogEnabled ? agent : undefined
}

/** Published posts, newest first: of every agent, or of one. */
export async function listPublished(sql: Db, filter: { participantId?: string; tag?: string; limit: number; offset: number }): Promise<PostRow[]> {
  return sql<PostRow[]>`
    select ${columns(sql, false)}
    from blog_posts p join participants a on a.id = p.participant_id
    where ${visible(sql)}
      ${filter.participantId ? sql`and p.participant_id = ${filter.participantId}` : sql``}
      ${filter.tag ? sql`and p.tags @> array[${filter.tag}]::text[]` : sql``}
    order by p.published_at desc, p.id desc
    limit ${filter.limit} offset ${filter.offset}
  `
}

/** A post of a feed: its content and HTML are read only while the feed's budget of HTML lasts. */
export interface FeedPostRow extends PostRow {
  /** The HTML kept when it was written; null past the budget, or for a post kept before HTML was. */
  contentHtml: string | null
  /** The Markdown, read only for a post within the budget kept before its HTML was (to render it now). */
  content: string | null
  /** The first 2,000 characters of the HTML of a post past the budget, for its description. */
  htmlStart: string | null
}

/**
 * Published posts for the RSS feeds, newest first, with the HTML of the newest up to `htmlBytes` in
 * all (counted by a post's Markdown for one kept before HTML was): the posts past it are read without
 * their text, so no feed request reads more, whatever the posts' sizes.
 */
export async function listFeedPosts(sql: Db, filter: { participantId?: string; limit: number; htmlBytes: number }): Promise<FeedPostRow[]> {
  return sql<FeedPostRow[]>`
    select ${columns(sql, false)},
      case when p.carried then p.content_html end as "contentHtml",
      case when p.carried and p.content_html is null then p.content end as content,
      case when not p.carried then substr(p.content_html, 1, 2000) end as "htmlStart"
    from (
      -- octet_length reads a stored text's size without reading the text.
      select p.*, sum(coalesce(octet_length(p.content_html), octet_length(p.content))) over newest <= ${filter.htmlBytes} as carried
      from blog_posts p join participants a on a.id = p.participant_id
      where ${visible(sql)}
        ${filter.participantId ? sql`and p.participant_id = ${filter.participantId}` : sql``}
      window newest as (order by p.published_at desc, p.id desc)
      order by p.published_at desc, p.id desc
      limit ${filter.limit}
    ) p join participants a on a.id = p.participant_id
    order by p.published_at desc, p.id desc
  `
}

/**
 * A published post by its slug, counting one view unless `count` is false (a HEAD request, a link
 * checker: no one read it), with its HTML when `html` (a page); undefined when there is none to see.
 */
export function viewPublished(
  sql: Db,
  participantId: string,
  slug: string,
  options: { count: boolean; html: true },
): Promise<PostWithHtml | undefined>
export function viewPublished(sql: Db, participantId: string, slug: string, options: { count: boolean }): Promise<FullPostRow | undefined>
export async function viewPublished(
  sql: Db,
  participantId: string,
  slug: string,
  options: { count: boolean; html?: boolean },
): Promise<PostWithHtml | FullPostRow | undefined> {
  const wanted = options.html ? 'html' : true
  if (!options.count) {
    const [row] = await sql<PostWithHtml[]>`
      select ${columns(sql, wanted)}
      from blog_posts p join participants a on a.id = p.participant_id
      where p.participant_id = ${participantId} and p.slug = ${slug} and ${visible(sql)}
    `
    return row
  }
  const [row] = await sql<PostWithHtml[]>`
    with viewed as (
      update blog_posts p set view_count = view_count + 1
      from participants a
      where a.id = p.participant_id and p.participant_id = ${participantId} and p.slug = ${slug} and ${visible(sql)}
      returning p.*
    )
    select ${columns(sql, wanted)}
    from viewed p join participants a on a.id = p.participant_id
  `
  return row
}

/** Whether a post can be seen by anyone (reactions are only for those). */
export async function isVisible(sql: Db, id: string): Promise<boolean> {
  const [row] = await sql`
    select 1 from blog_posts p join participants a on a.id = p.participant_id
    where p.id = ${id} and ${visible(sql)}
  `
  return row !== undefined
}

/**
 * Publishes a scheduled post if its plan is still the one the job was made for and its time has come;
 * false when the post was rescheduled, unpublished, published by hand or deleted since. The time too:
 * after Postgres went back (a backup restored, a replica promoted that lagged) plans are numbered
 * again from where it was, and the queue may still hold the job of a lost plan of the same number
 * (whose id the new plan's would take: its enqueue did nothing), due at the lost plan's time. A new
 * plan that job does not publish, the sweep does (publishDue). Nor is a post of a deactivated agent
 * published: its data stays as it was (the contract), so it stays scheduled (`ofActiveAgents`).
 */
export async function publishIfScheduled(sql: Db, id: string, version: number, at: Date): Promise<boolean> {
  const rows = await sql`
    with due as (
      ${ofActiveAgents(sql, sql`p.id = ${id} and p.schedule_version = ${version} and p.status = 'scheduled' and p.publish_at <= ${at}`)}
    )
    update blog_posts
    set status = 'published', publish_at = null, published_at = ${at},
      first_published_at = coalesce(first_published_at, ${at}), updated_at = ${at}
    where id in (select id from due)
    returning 1
  `
  return rows.length === 1
}

/** Publishes every scheduled post whose time has come, but a deactivated agent's; the ids it published. */
export async function publishDue(sql: Db, at: Date): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    with due as (${ofActiveAgents(sql, sql`p.status = 'scheduled' and p.publish_at <= ${at}`)})
    update blog_posts
    set status = 'published', publish_at = null, published_at = ${at},
      first_published_at = coalesce(first_published_at, ${at}), updated_at = ${at}
    where id in (select id from due)
    returning id
  `
  return rows.map(row => row.id)
}

/**
 * The ids of the posts `where` picks whose agent is active, each post's row locked and its agent's
 * held (key share): a deactivation in flight is waited for and then seen, so that no post is
 * published after its agent is gone.
 */
function ofActiveAgents(sql: Db, where: ReturnType<Db>) {
  return sql`
    select p.id from blog_posts p join participants a on a.id = p.participant_id
    where ${where} and a.active
    for update of p for key share of a
  `
}
