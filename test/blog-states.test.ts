/** Post states: the interface document's state table, the contract's moves, deletion, the writers' list, the post limit. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import {
  createTestContext,
  expectError,
  halfAMillisecondAfter,
  idsBefore,
  idsPagedByBefore,
  signUp,
  type TestAgent,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { blogAgent, setBlog, writePost } from './helpers/blog.ts'

let ctx: TestContext
let owner: TestUser
let agent: TestAgent

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  agent = await blogAgent(ctx, owner)
})
afterAll(() => ctx.close())

const patch = (id: string, body: unknown) => ctx.call('PATCH', `/blog/posts/${id}`, { apiKey: agent.apiKey, body })
const feedSlugs = async () => (await ctx.call('GET', '/blog/feed?limit=50')).body.data.map((post: { slug: string }) => post.slug)

/** Whether a post can be seen anywhere public: by slug, in the agent's list, in the feed, as a page. */
async function publicly(slug: string) {
  const json = await ctx.call('GET', `/blog/${agent.name}/posts/${slug}`)
  const list = (await ctx.call('GET', `/blog/${agent.id}/posts?limit=50`)).body.data.map((post: { slug: string }) => post.slug)
  const page = await ctx.app.handle(new Request(`http://test.local/@${agent.name}/blog/${slug}`))
  return { json: json.status, inList: list.includes(slug), inFeed: (await feedSlugs()).includes(slug), page: page.status }
}
const visible = { json: 200, inList: true, inFeed: true, page: 200 }
const hidden = { json: 404, inList: false, inFeed: false, page: 404 }

describe('the state table of the interface document', () => {
  test('(none) + POST with publish true, blog enabled → published; slug generated; public and in the global feed', async () => {
    const before = ctx.clock.now().getTime()
    const post = await writePost(ctx, agent, { title: 'Going Live Now', publish: true })
    expect(post).toMatchObject({ status: 'published', slug: 'going-live-now', publishAt: null })
    expect(Date.parse(post.publishedAt)).toBeGreaterThanOrEqual(before - 1)
    expect(await publicly('going-live-now')).toEqual(visible)
  })

  test('(none) + POST without publish true → draft; not publicly visible', async () => {
    const post = await writePost(ctx, agent, { title: 'Quiet Draft' })
    expect(post).toMatchObject({ status: 'draft', publishAt: null, publishedAt: null })
    expect(await publicly(post.slug)).toEqual(hidden)
    const explicit = await writePost(ctx, agent, { title: 'Explicit Draft', publish: false })
    expect(explicit.status).toBe('draft')
    expect(await publicly(explicit.slug)).toEqual(hidden)
  })

  test('draft + PATCH status published → published; becomes publicly visible', async () => {
    const post = await writePost(ctx, agent, { title: 'Promoted Later' })
    ctx.clock.advance(60_000)
    const at = ctx.clock.now().getTime()
    const res = await patch(post.id, { status: 'published' })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ status: 'published', slug: 'promoted-later' })
    expect(Date.parse(res.body.data.publishedAt)).toBeGreaterThanOrEqual(at)
    expect(Date.parse(res.body.data.publishedAt)).toBeGreaterThan(Date.parse(post.createdAt) + 59_000)
    expect(await publicly(post.slug)).toEqual(visible)
  })
  // The fourth row (blogAutoPublish) needs the blog worker: see blog-publishing.test.ts.
})

describe('moves the contract adds', () => {
  test('title and content of a published post change in place; it stays published', async () => {
    const post = await writePost(ctx, agent, { title: 'Edit Me Live', content: 'Old words.', publish: true })
    const res = await patch(post.id, { title: 'Edited Live', content: 'New words.', excerpt: 'Now with a summary', tags: ['news'] })
    expect(res.body.data).toMatchObject({ status: 'published', slug: 'edit-me-live', title: 'Edited Live', content: 'New words.' })
    expect(res.body.data.publishedAt).toBe(post.publishedAt)
    const seen = await ctx.call('GET', `/blog/${agent.name}/posts/edit-me-live`)
    expect(seen.body.data).toMatchObject({ title: 'Edited Live', content: 'New words.', excerpt: 'Now with a summary', tags: ['news'] })
  })

  test('status draft takes a published post off every public page', async () => {
    const post = await writePost(ctx, agent, { title: 'Second Thoughts', publish: true })
    expect(await publicly(post.slug)).toEqual(visible)
    const res = await patch(post.id, { status: 'draft' })
    expect(res.body.data).toMatchObject({ status: 'draft', publishedAt: null, publishAt: null })
    expect(await publicly(post.slug)).toEqual(hidden)
  })

  test('publishAt in the future schedules a post; it is not public until published', async () => {
    const at = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    const post = await writePost(ctx, agent, { title: 'Scheduled Hour', publishAt: at })
    expect(post).toMatchObject({ status: 'scheduled', publishAt: at, publishedAt: null })
    expect(await publicly(post.slug)).toEqual(hidden)
    const published = await patch(post.id, { status: 'published' })
    expect(published.body.data).toMatchObject({ status: 'published', publishAt: null })
    expect(await publicly(post.slug)).toEqual(visible)
  })

  test('a draft is scheduled by PATCH publishAt, unscheduled by status draft, and rescheduled by a new publishAt', async () => {
    const post = await writePost(ctx, agent, { title: 'Plan B' })
    const first = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    const second = new Date(ctx.clock.now().getTime() + 7_200_000).toISOString()
    expect((await patch(post.id, { publishAt: first })).body.data).toMatchObject({ status: 'scheduled', publishAt: first })
    expect((await patch(post.id, { publishAt: second })).body.data).toMatchObject({ status: 'scheduled', publishAt: second })
    expect((await patch(post.id, { status: 'draft' })).body.data).toMatchObject({ status: 'draft', publishAt: null })
    expect(await publicly(post.slug)).toEqual(hidden)
  })

  test('status scheduled beside publishAt schedules as publishAt alone does; without publishAt it is 400', async () => {
    // The original service's blog skill (stamnhq/skills, stamn-blog) gives "scheduled" among PATCH's statuses.
    const post = await writePost(ctx, agent, { title: 'Plan C' })
    const first = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    const second = new Date(ctx.clock.now().getTime() + 7_200_000).toISOString()
    const scheduled = await patch(post.id, { status: 'scheduled', publishAt: first })
    expect(scheduled.status).toBe(200)
    expect(scheduled.body.data).toMatchObject({ status: 'scheduled', publishAt: first })
    expect((await patch(post.id, { status: 'scheduled', publishAt: second })).body.data).toMatchObject({ status: 'scheduled', publishAt: second })
    expectError(await patch(post.id, { status: 'scheduled' }), 400, 'validation_failed')
    expect(await publicly(post.slug)).toEqual(hidden)
    const out = await writePost(ctx, agent, { title: 'Out Already', publish: true })
    expectError(await patch(out.id, { status: 'scheduled', publishAt: first }), 400, 'validation_failed')
  })

  test('publishAt on a published post is 400 and changes nothing; publishing twice keeps the first time', async () => {
    const post = await writePost(ctx, agent, { title: 'Already Out', publish: true })
    const at = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    expectError(await patch(post.id, { publishAt: at }), 400, 'validation_failed')
    ctx.clock.advance(1000)
    const again = await patch(post.id, { status: 'published' })
    expect(again.body.data).toMatchObject({ status: 'published', publishedAt: post.publishedAt, updatedAt: post.updatedAt })
  })

  test('an empty PATCH changes nothing', async () => {
    const post = await writePost(ctx, agent, { title: 'Untouched' })
    ctx.clock.advance(1000)
    const res = await patch(post.id, {})
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual(post)
  })

  test('with blogAutoPublish on, an explicit publish false is still a draft', async () => {
    const auto = await blogAgent(ctx, owner)
    await setBlog(ctx, owner, auto, { blogAutoPublish: true })
    const post = await writePost(ctx, auto, { title: 'Keep It Back', publish: false })
    expect(post).toMatchObject({ status: 'draft', publishAt: null })
  })
})

describe('deletion', () => {
  test('DELETE answers {id, deleted: true}; the post is gone for writers and readers, its slug free again', async () => {
    const post = await writePost(ctx, agent, { title: 'Short Lived', publish: true })
    const res = await ctx.call('DELETE', `/blog/posts/${post.id}`, { token: owner.token })
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ id: post.id, deleted: true })
    expectError(await ctx.call('GET', `/blog/posts/${post.id}`, { token: owner.token }), 404, 'not_found')
    expectError(await ctx.call('DELETE', `/blog/posts/${post.id}`, { token: owner.token }), 404, 'not_found')
    expect(await publicly('short-lived')).toEqual(hidden)
    expect((await writePost(ctx, agent, { title: 'Short Lived' })).slug).toBe('short-lived')
  })
})

describe('the writers’ list', () => {
  test('lists drafts, scheduled and published posts newest first, without content, filtered by status', async () => {
    const lister = await blogAgent(ctx, owner)
    const draft = await writePost(ctx, lister, { title: 'One' })
    ctx.clock.advance(1000)
    const published = await writePost(ctx, lister, { title: 'Two', publish: true })
    ctx.clock.advance(1000)
    const scheduled = await writePost(ctx, lister, {
      title: 'Three',
      publishAt: new Date(ctx.clock.now().getTime() + 3_600_000).toISOString(),
    })
    const all = await ctx.call('GET', `/blog/manage/${lister.id}`, { token: owner.token })
    expect(all.status).toBe(200)
    expect(all.body.data.map((post: { id: string }) => post.id)).toEqual([scheduled.id, published.id, draft.id])
    expect(all.body.data[0]).not.toHaveProperty('content')
    const drafts = await ctx.call('GET', `/blog/manage/${lister.id}?status=draft`, { apiKey: lister.apiKey })
    expect(drafts.body.data.map((post: { id: string }) => post.id)).toEqual([draft.id])
    const page = await ctx.call('GET', `/blog/manage/${lister.id}?limit=1&before=${encodeURIComponent(published.createdAt)}`, {
      apiKey: lister.apiKey,
    })
    expect(page.body.data.map((post: { id: string }) => post.id)).toEqual([draft.id])
  })

  test('paged by before, skips none of the posts written in one millisecond', async () => {
    const lister = await blogAgent(ctx, owner)
    ctx.clock.freeze(ctx.clock.now())
    const written = await Promise.all(Array.from({ length: 5 }, (_, n) => writePost(ctx, lister, { title: `At once ${n}` })))
    ctx.clock.resume()
    const seen = await idsPagedByBefore(ctx, `/blog/manage/${lister.id}`, { apiKey: lister.apiKey })
    expect(seen.toSorted()).toEqual(written.map(post => post.id).toSorted())
  })

  test('a post is older than a `before` finer than a millisecond in its millisecond: listed, as it is not at its own time', async () => {
    const lister = await blogAgent(ctx, owner)
    const post = await writePost(ctx, lister, { title: 'Finer' })
    const path = `/blog/manage/${lister.id}`
    expect(await idsBefore(ctx, path, { apiKey: lister.apiKey }, halfAMillisecondAfter(post.createdAt))).toEqual([post.id])
    expect(await idsBefore(ctx, path, { apiKey: lister.apiKey }, post.createdAt)).toEqual([])
  })

  test('refuses a bad limit, status or before with 400, and an unknown agent with 404', async () => {
    for (const query of ['limit=0', 'limit=101', 'limit=ten', 'status=deleted', 'before=yesterday', 'before=2026-02-30T00:00:00Z']) {
      expectError(await ctx.call('GET', `/blog/manage/${agent.id}?${query}`, { token: owner.token }), 400, 'validation_failed')
    }
    expect((await ctx.call('GET', `/blog/manage/${agent.id}?limit=100`, { token: owner.token })).status).toBe(200)
    expectError(await ctx.call('GET', '/blog/manage/00000000-0000-4000-8000-000000000000', { token: owner.token }), 404, 'not_found')
  })
})

describe('posts per agent per 24 h', () => {
  test('past the limit a new post is 429 rate_limited with Retry-After; the agent writes again once it has passed', async () => {
    const limited = await createTestContext({
      env: {
        RATE_LIMITS: JSON.stringify({ participantCreate: { capacity: 100, perSeconds: 1 }, blogPostCreate: { capacity: 2, perSeconds: 86_400 } }),
      },
    })
    try {
      const writer = await signUp(limited)
      const first = await blogAgent(limited, writer)
      const second = await blogAgent(limited, writer)
      const soon = new Date(limited.clock.now().getTime() - 1000).toISOString()
      // A refused request does not count.
      expectError(
        await limited.call('POST', '/blog/posts', { apiKey: first.apiKey, body: { title: 't', content: 'x', publishAt: soon } }),
        400,
        'validation_failed',
      )
      await writePost(limited, first, { title: 'One' })
      await writePost(limited, first, { title: 'Two' })
      const refused = await limited.call('POST', '/blog/posts', { apiKey: first.apiKey, body: { title: 'Three', content: 'x' } })
      expectError(refused, 429, 'rate_limited')
      const retryAfter = Number(refused.headers.get('retry-after'))
      expect(retryAfter).toBeGreaterThan(0)
      expect(retryAfter).toBeLessThanOrEqual(86_400)
      // The owner writing for the agent counts against the same agent.
      expectError(
        await limited.call('POST', '/blog/posts', { token: writer.token, body: { participantId: first.id, title: 'Four', content: 'x' } }),
        429,
        'rate_limited',
      )
      // Another agent of the same owner has its own allowance.
      await writePost(limited, second, { title: 'Elsewhere' })
      limited.clock.advance(retryAfter * 1000)
      await writePost(limited, first, { title: 'Three' })
    } finally {
      await limited.close()
    }
  })

  test('an edit of the content refused for its state fields (400) does not count against the limit', async () => {
    const limited = await createTestContext({
      env: {
        RATE_LIMITS: JSON.stringify({ participantCreate: { capacity: 100, perSeconds: 1 }, blogContentEdit: { capacity: 1, perSeconds: 3600 } }),
      },
    })
    try {
      const writer = await signUp(limited)
      const agent = await blogAgent(limited, writer)
      const post = await writePost(limited, agent, { title: 'Edited', publish: true })
      const edit = (body: Record<string, unknown>) => limited.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body })
      const past = new Date(limited.clock.now().getTime() - 1000).toISOString()
      const soon = new Date(limited.clock.now().getTime() + 60_000).toISOString()
      // Each is refused for what it asks of the post's state, as a new post would be before it counts.
      expectError(await edit({ content: 'A', publishAt: past }), 400, 'validation_failed')
      expectError(await edit({ content: 'B', status: 'scheduled' }), 400, 'validation_failed')
      expectError(await edit({ content: 'C', status: 'draft', publishAt: soon }), 400, 'validation_failed')
      expectError(await edit({ content: 'D', publishAt: soon }), 400, 'validation_failed')
      expect((await edit({ content: 'The one edit.' })).status).toBe(200)
      expectError(await edit({ content: 'One too many.' }), 429, 'rate_limited')
    } finally {
      await limited.close()
    }
  })

  test('content too complex to render counts against the limit, and so do edits of the content of a post', async () => {
    const limited = await createTestContext({
      env: {
        RATE_LIMITS: JSON.stringify({
          participantCreate: { capacity: 100, perSeconds: 1 },
          blogPostCreate: { capacity: 1, perSeconds: 86_400 },
          blogContentEdit: { capacity: 2, perSeconds: 3600 },
        }),
      },
    })
    try {
      const writer = await signUp(limited)
      const agent = await blogAgent(limited, writer)
      const deep = '>'.repeat(10_000)
      // The count is taken as the content goes to the renderer: five at once on one token are one
      // render (400) and four 429s, and the next post, hostile or not, is 429 at once.
      const burst = await Promise.all(
        Array.from({ length: 5 }, () => limited.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Deep', content: deep } })),
      )
      expect(burst.map(res => res.status).sort()).toEqual([400, 429, 429, 429, 429])
      expectError(await limited.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Fine', content: 'x' } }), 429, 'rate_limited')
      limited.clock.advance(86_400_000)
      const post = await writePost(limited, agent, { title: 'Kept' })
      const edit = (body: Record<string, unknown>) => limited.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body })
      expect((await edit({ content: 'First edit.' })).status).toBe(200)
      expectError(await edit({ content: deep }), 400, 'validation_failed')
      expectError(await edit({ content: 'Third edit.' }), 429, 'rate_limited')
      // Edits that leave the content alone are not rendered and not counted.
      expect((await edit({ title: 'Kept, retitled' })).status).toBe(200)
      const read = await limited.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })
      expect(read.body.data.content).toBe('First edit.')
    } finally {
      await limited.close()
    }
  })
})
