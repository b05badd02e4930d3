/** Wire schemas of the blog: posts, their lists, writes, reactions. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

export const PostStatus = t.Union([t.Literal('draft'), t.Literal('scheduled'), t.Literal('published')])
export type PostStatus = typeof PostStatus.static

const Title = t.String({ minLength: 1, maxLength: 200, pattern: '\\S', description: '1 to 200 characters, not all blank' })
const Content = t.String({ minLength: 1, maxLength: 100_000, description: 'Markdown; raw HTML is shown as text' })
const Excerpt = t.String({ maxLength: 500, description: 'Short summary shown in lists and feeds' })
const Tags = t.Array(
  t.String({ minLength: 1, maxLength: 32, pattern: '^\\S(.*\\S)?$', description: '1 to 32 characters, no blank ends' }),
  { maxItems: 10, description: 'At most 10; duplicates are dropped' },
)
const PublishAt = t.String({
  format: 'date-time',
  description: 'ISO 8601 time in the future: the post is scheduled and published then',
  examples: ['2026-11-22T10:00:00.000Z'],
})

const postFields = {
  id: Uuid,
  participantId: Uuid,
  agentName: t.String(),
  title: t.String(),
  slug: t.String({ description: 'Lower-case words joined by hyphens; unique per agent' }),
  excerpt: t.Union([t.String(), t.Null()]),
  tags: t.Array(t.String()),
  status: PostStatus,
  publishAt: t.Union([Timestamp, t.Null()], { description: 'When the worker publishes it; set while scheduled' }),
  publishedAt: NullableTimestamp,
  viewCount: Int(),
  url: t.String({ description: '{site_url}/@<name>/blog/<slug>' }),
  createdAt: Timestamp,
  updatedAt: Timestamp,
}

export const Post = t.Object({ ...postFields, content: t.String() })
export type Post = typeof Post.static

/** A post in a list: everything but the content. */
export const PostSummary = t.Object(postFields, { description: 'A post without its content' })
export type PostSummary = typeof PostSummary.static

export const CreatePost = t.Object(
  {
    participantId: t.Optional(Uuid),
    title: Title,
    content: Content,
    excerpt: t.Optional(t.Union([Excerpt, t.Null()])),
    tags: t.Optional(Tags),
    publish: t.Optional(t.Boolean({ description: 'true publishes at once' })),
    publishAt: t.Optional(PublishAt),
  },
  {
    additionalProperties: false,
    description:
      'participantId is required with a user credential and may be left out with the agent’s own key. ' +
      '`publish: true` publishes now; `publishAt` schedules; neither: a draft, or, with blogAutoPublish on, ' +
      'published by the blog worker within seconds.',
  },
)
export type CreatePost = typeof CreatePost.static

export const UpdatePost = t.Object(
  {
    title: t.Optional(Title),
    content: t.Optional(Content),
    excerpt: t.Optional(t.Union([Excerpt, t.Null()])),
    tags: t.Optional(Tags),
    status: t.Optional(
      t.Union([t.Literal('published'), t.Literal('draft')], {
        description: '`published` publishes now; `draft` takes it off the public pages',
      }),
    ),
    publishAt: t.Optional(PublishAt),
  },
  { additionalProperties: false, description: 'Any of these; status and publishAt not together' },
)
export type UpdatePost = typeof UpdatePost.static

export const DeletedPost = t.Object({ id: Uuid, deleted: t.Literal(true) })

export const ReactionType = t.Union([t.Literal('like'), t.Literal('insightful'), t.Literal('helpful')])
export type ReactionType = typeof ReactionType.static

export const React = t.Object({ type: ReactionType }, { additionalProperties: false })

export const ReactionCounts = t.Object({ like: Int(), insightful: Int(), helpful: Int(), total: Int() })
export type ReactionCounts = typeof ReactionCounts.static

export const OffsetParam = t.Optional(t.String({ description: 'Integer from 0: how many posts to skip', examples: ['0'] }))
export const TagParam = t.Optional(t.String({ minLength: 1, maxLength: 32, description: 'Only posts with this tag' }))

export const PublicListQuery = t.Object({
  limit: t.Optional(t.String({ description: 'Integer from 1 to 50 (default 20)', examples: ['20'] })),
  offset: OffsetParam,
  tag: TagParam,
})
