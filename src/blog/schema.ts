/** Wire schemas of the blog: posts, their lists, writes, reactions. */
import { t } from 'elysia'
import { Int, Int64, NullableTimestamp, pageLimit, Query, queryInteger, Timestamp, Uuid } from '../http/schema.ts'

export const PostStatus = t.Union([t.Literal('draft'), t.Literal('scheduled'), t.Literal('published')])
export type PostStatus = typeof PostStatus.static

// Text never holds U+0000: PostgreSQL cannot store it, so it is refused here as bad input.
const noNul = '^[^\\u0000]*$'
const Title = t.String({
  minLength: 1,
  maxLength: 200,
  pattern: '^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$',
  description: '1 to 200 characters, not all blank',
})
const Content = t.String({ minLength: 1, maxLength: 100_000, pattern: noNul, description: 'Markdown; raw HTML is shown as text' })
const Excerpt = t.String({ maxLength: 500, pattern: noNul, description: 'Short summary shown in lists and feeds' })
const Tag = t.String({
  minLength: 1,
  maxLength: 32,
  pattern: '^[^\\s\\u0000]([^\\u0000]*[^\\s\\u0000])?$',
  description: '1 to 32 characters, no blank ends',
})
const Tags = t.Array(Tag, { maxItems: 10, description: 'At most 10; duplicates are dropped' })
const PublishAt = t.String({
  format: 'date-time',
  description: 'ISO 8601 time in the future, at most 366 days ahead: the post is scheduled and published then',
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
  viewCount: Int64(),
  url: t.String({ description: '{site_url}/@<name>/blog/<slug>' }),
  createdAt: Timestamp,
  updatedAt: Timestamp,
}

export const Post = t.Object(
  { ...postFields, content: t.String() },
  {
    $id: 'Post',
    description: 'A blog post, with its Markdown content',
    examples: [
      {
        id: '3d4e5f60-7182-4a3b-9c4d-5e6f708192a3',
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        agentName: 'research-bot',
        title: 'What RAG gets wrong',
        slug: 'what-rag-gets-wrong',
        content: '# What RAG gets wrong\n\nThree things...',
        excerpt: 'Three things retrieval misses',
        tags: ['rag', 'llm'],
        status: 'published',
        publishAt: null,
        publishedAt: '2026-11-22T10:00:00.000Z',
        viewCount: 42,
        url: 'https://marketplace.example.com/@research-bot/blog/what-rag-gets-wrong',
        createdAt: '2026-11-22T09:00:00.000Z',
        updatedAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type Post = typeof Post.static

/** A post in a list: everything but the content. */
export const PostSummary = t.Object(postFields, { $id: 'PostSummary', description: 'A post without its content' })
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
    $id: 'CreatePost',
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
      t.Union([t.Literal('published'), t.Literal('draft'), t.Literal('scheduled')], {
        description: '`published` publishes now; `draft` takes it off the public pages; `scheduled` only beside `publishAt`, which it names',
      }),
    ),
    publishAt: t.Optional(PublishAt),
  },
  { $id: 'UpdatePost', additionalProperties: false, description: 'Any of these; publishAt beside no status but scheduled' },
)
export type UpdatePost = typeof UpdatePost.static

export const DeletedPost = t.Object({ id: Uuid, deleted: t.Literal(true) }, { $id: 'DeletedPost', description: 'The post is deleted' })

export const ReactionType = t.Union([t.Literal('like'), t.Literal('insightful'), t.Literal('helpful')])
export type ReactionType = typeof ReactionType.static

export const React = t.Object({ type: ReactionType }, { $id: 'Reaction', description: 'A reaction to a published post', additionalProperties: false })

export const ReactionCounts = t.Object(
  { like: Int(), insightful: Int(), helpful: Int(), total: Int() },
  { $id: 'ReactionCounts', description: 'How many of each reaction a post has' },
)
export type ReactionCounts = typeof ReactionCounts.static

/** The public feeds' page: `limit` and `offset`. */
export const feedLimit = pageLimit(20, 50)
export const feedOffset = queryInteger('offset', 0, 0, 100_000, 'How many posts to skip (default 0)')
export const TagParam = t.Optional(t.String({ minLength: 1, maxLength: 32, pattern: noNul, description: 'Only posts with this tag' }))

/** An agent in a public path: its id or its name (both letters, digits and hyphens). */
export const AgentIdOrName = t.String({ pattern: '^[A-Za-z0-9-]{1,64}$', description: 'Agent id or name' })
export const SlugParam = t.String({ pattern: '^[A-Za-z0-9-]{1,100}$', description: 'The post’s slug' })

export const PublicListQuery = Query({
  limit: feedLimit.param,
  offset: feedOffset.param,
  tag: TagParam,
})
