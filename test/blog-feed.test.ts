/** The public JSON blog: the global feed, an agent's posts, a post by slug with its views, and reactions. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { blogAgent, setBlog, writePost } from './helpers/blog.ts'
import { addReaction, reactionCounts } from '../src/blog/reactions.ts'

let ctx: TestContext
let owner: TestUser
let reader: TestUser
let agents: TestAgent[]
/** Published post ids, oldest first. */
const published: string[] = []
const hiddenIds: string[] = []

const ids = (res: { body: { data: { id: string }[] } }) => res.body.data.map(post => post.id)

interface PlanNode {
  'Node Type': string
  'Actual Rows': number
  'Actual Loops': number
  Plans?: PlanNode[]
}

/** The rows a plan's scans returned, in all (an EXPLAIN ANALYZE's JSON). */
function rowsRead(node: PlanNode): number {
  const own = /Scan/.test(node['Node Type']) ? node['Actual Rows'] * node['Actual Loops'] : 0
  return own + (node.Plans ?? []).reduce((sum, child) => sum + rowsRead(child), 0)
}

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  reader = await signUp(ctx)
  agents = [await blogAgent(ctx, owner), await blogAgent(ctx, owner), await blogAgent(ctx, reader)]
  for (let i = 0; i < 22; i++) {
    ctx.clock.advance(1000)
    const post = await writePost(ctx, agents[i % 3]!, { title: `Post ${i}`, publish: true, tags: i % 4 === 0 ? ['ai', 'news'] : ['misc'] })
    published.push(post.id)
  }
  ctx.clock.advance(1000)
  // Neither drafts, scheduled, unpublished nor deleted posts are ever listed.
  hiddenIds.push((await writePost(ctx, agents[0]!, { title: 'A draft', tags: ['ai'] })).id)
  hiddenIds.push(
    (await writePost(ctx, agents[0]!, { title: 'Later', tags: ['ai'], publishAt: new Date(ctx.clock.now().getTime() + 3_600_000).toISOString() })).id,
  )
  const unpublished = await writePost(ctx, agents[1]!, { title: 'Pulled', publish: true, tags: ['ai'] })
  await ctx.call('PATCH', `/blog/posts/${unpublished.id}`, { apiKey: agents[1]!.apiKey, body: { status: 'draft' } })
  const deleted = await writePost(ctx, agents[1]!, { title: 'Deleted', publish: true, tags: ['ai'] })
  await ctx.call('DELETE', `/blog/posts/${deleted.id}`, { apiKey: agents[1]!.apiKey })
  hiddenIds.push(unpublished.id, deleted.id)
})
afterAll(() => ctx.close())

describe('GET /blog/feed', () => {
  test('published posts of every agent, newest first, 20 by default, without content', async () => {
    const res = await ctx.call('GET', '/blog/feed')
    expect(res.status).toBe(200)
    expect(ids(res)).toEqual(published.slice().reverse().slice(0, 20))
    expect(new Set(res.body.data.map((post: { participantId: string }) => post.participantId)).size).toBe(3)
    for (const post of res.body.data) {
      expect(post).not.toHaveProperty('content')
      expect(post.status).toBe('published')
      expect(post.url).toBe(`http://test.local/@${post.agentName}/blog/${post.slug}`)
    }
  })

  test('pages by limit and offset', async () => {
    const newest = published.slice().reverse()
    expect(ids(await ctx.call('GET', '/blog/feed?limit=5&offset=5'))).toEqual(newest.slice(5, 10))
    expect(ids(await ctx.call('GET', '/blog/feed?offset=20'))).toEqual(newest.slice(20))
    expect(ids(await ctx.call('GET', '/blog/feed?limit=50'))).toEqual(newest)
    expect(ids(await ctx.call('GET', '/blog/feed?offset=100'))).toEqual([])
  })

  test('filters by tag', async () => {
    const tagged = published.filter((_, i) => i % 4 === 0).reverse()
    expect(ids(await ctx.call('GET', '/blog/feed?tag=ai&limit=50'))).toEqual(tagged)
    expect(ids(await ctx.call('GET', '/blog/feed?tag=AI'))).toEqual([])
    expect(ids(await ctx.call('GET', '/blog/feed?tag=nothing'))).toEqual([])
  })

  test('never lists drafts, scheduled, unpublished or deleted posts', async () => {
    const all = ids(await ctx.call('GET', '/blog/feed?limit=50'))
    for (const id of hiddenIds) expect(all).not.toContain(id)
    const tagged = ids(await ctx.call('GET', '/blog/feed?tag=ai&limit=50'))
    for (const id of hiddenIds) expect(tagged).not.toContain(id)
  })

  test.each(['limit=51', 'limit=0', 'limit=-1', 'limit=ten', 'offset=-1', 'offset=abc', 'offset=100001', `tag=${'x'.repeat(33)}`, 'tag=%00'])(
    'refuses %s with 400',
    async query => {
      expectError(await ctx.call('GET', `/blog/feed?${query}`), 400, 'validation_failed')
    },
  )

  test('an agent whose blog is switched off, or who is deactivated, leaves the feed', async () => {
    const owner2 = await signUp(ctx)
    const leaving = await blogAgent(ctx, owner2)
    const switching = await blogAgent(ctx, owner2)
    ctx.clock.advance(1000)
    const a = await writePost(ctx, leaving, { title: 'Bye', publish: true })
    const b = await writePost(ctx, switching, { title: 'Off', publish: true })
    expect(ids(await ctx.call('GET', '/blog/feed?limit=2'))).toEqual([b.id, a.id])
    await ctx.call('DELETE', `/v1/participants/${leaving.id}`, { token: owner2.token })
    await setBlog(ctx, owner2, switching, { blogEnabled: false })
    const after = ids(await ctx.call('GET', '/blog/feed?limit=50'))
    expect(after).not.toContain(a.id)
    expect(after).not.toContain(b.id)
    expectError(await ctx.call('GET', `/blog/${leaving.name}/posts`), 404, 'not_found')
    expectError(await ctx.call('GET', `/blog/${switching.name}/posts/${b.slug}`), 404, 'not_found')
    await setBlog(ctx, owner2, switching, { blogEnabled: true })
    expect((await ctx.call('GET', `/blog/${switching.name}/posts/${b.slug}`)).status).toBe(200)
  })
})

describe('an agent’s public posts', () => {
  test('lists its published posts by id or by name, newest first, with the same paging and tag filter', async () => {
    const agent = agents[0]!
    const mine = published.filter((_, i) => i % 3 === 0).reverse()
    expect(ids(await ctx.call('GET', `/blog/${agent.name}/posts`))).toEqual(mine)
    expect(ids(await ctx.call('GET', `/blog/${agent.id}/posts`))).toEqual(mine)
    expect(ids(await ctx.call('GET', `/blog/${agent.name.toUpperCase()}/posts`))).toEqual(mine)
    expect(ids(await ctx.call('GET', `/blog/${agent.name}/posts?limit=2&offset=1`))).toEqual(mine.slice(1, 3))
    expect(ids(await ctx.call('GET', `/blog/${agent.name}/posts?tag=ai`))).toEqual(published.filter((_, i) => i % 12 === 0).reverse())
    expectError(await ctx.call('GET', `/blog/${agent.name}/posts?limit=51`), 400, 'validation_failed')
  })

  test('an unknown agent, or one whose blog was never enabled, is 404', async () => {
    expectError(await ctx.call('GET', '/blog/no-such-agent/posts'), 404, 'not_found')
    expectError(await ctx.call('GET', '/blog/00000000-0000-4000-8000-000000000000/posts'), 404, 'not_found')
    const quiet = await createAgent(ctx, owner)
    expectError(await ctx.call('GET', `/blog/${quiet.name}/posts`), 404, 'not_found')
    expectError(await ctx.call('GET', `/blog/${quiet.name}/rss`), 404, 'not_found')
  })

  test('a post by slug has its content and counts a view each time it is read publicly', async () => {
    const agent = agents[1]!
    const post = await writePost(ctx, agent, { title: 'Counted', content: '**Read me**', publish: true })
    const first = await ctx.call('GET', `/blog/${agent.name}/posts/counted`)
    expect(first.body.data).toMatchObject({ id: post.id, content: '**Read me**', viewCount: 1 })
    expect((await ctx.call('GET', `/blog/${agent.id}/posts/counted`)).body.data.viewCount).toBe(2)
    await ctx.app.handle(new Request(`http://test.local/@${agent.name}/blog/counted`))
    // A HEAD request (a link checker, a crawler's probe) reads nothing: no view.
    const server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
    try {
      for (const path of [`/blog/${agent.name}/posts/counted`, `/@${agent.name}/blog/counted`]) {
        const head = await fetch(`http://127.0.0.1:${server.server!.port}${path}`, { method: 'HEAD' })
        expect(head.status).toBe(200)
      }
    } finally {
      await server.stop()
    }
    // The writers' own reads are not views.
    expect((await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data.viewCount).toBe(3)
    expectError(await ctx.call('GET', `/blog/${agent.name}/posts/not-there`), 404, 'not_found')
    expectError(await ctx.call('GET', `/blog/${agent.name}/posts/%00`), 400, 'validation_failed')
    expectError(await ctx.call('GET', '/blog/%00/posts'), 400, 'validation_failed')
    expectError(await ctx.call('GET', '/blog/a%20b/rss'), 400, 'validation_failed')
    expectError(await ctx.call('GET', `/blog/${agents[0]!.name}/posts/counted`), 404, 'not_found')
  })

  test('an agent named "feed" has its own blog; /blog/feed stays the global feed', async () => {
    const feedAgent = await blogAgent(ctx, owner, 'feed')
    const post = await writePost(ctx, feedAgent, { title: 'From Feed', publish: true })
    expect(ids(await ctx.call('GET', '/blog/feed/posts'))).toEqual([post.id])
    expect((await ctx.call('GET', '/blog/feed/posts/from-feed')).body.data.id).toBe(post.id)
    const rss = await ctx.app.handle(new Request('http://test.local/blog/feed/rss'))
    expect(await rss.text()).toContain('<title>From Feed</title>')
    expect(ids(await ctx.call('GET', '/blog/feed?limit=1'))).toEqual([post.id])
  })
})

describe('reactions', () => {
  let postId: string
  const none = { like: 0, insightful: 0, helpful: 0, total: 0 }

  beforeAll(async () => {
    postId = (await writePost(ctx, agents[2]!, { title: 'React To Me', publish: true })).id
  })

  test('one of each type per reactor: 201 the first time, 200 with no change after; anyone reads the counts', async () => {
    const react = (credential: object, type: string) => ctx.call('POST', `/blog/posts/${postId}/reactions`, { ...credential, body: { type } })
    expect((await ctx.call('GET', `/blog/posts/${postId}/reactions`)).body.data).toEqual(none)
    const first = await react({ token: reader.token }, 'like')
    expect(first.status).toBe(201)
    expect(first.body.data).toEqual({ like: 1, insightful: 0, helpful: 0, total: 1 })
    const again = await react({ token: reader.token }, 'like')
    expect(again.status).toBe(200)
    expect(again.body.data).toEqual({ like: 1, insightful: 0, helpful: 0, total: 1 })
    expect((await react({ token: reader.token }, 'insightful')).status).toBe(201)
    expect((await react({ token: owner.token }, 'like')).status).toBe(201)
    expect((await react({ apiKey: agents[0]!.apiKey }, 'helpful')).status).toBe(201)
    expect((await react({ apiKey: agents[0]!.apiKey }, 'helpful')).status).toBe(200)
    const counts = await ctx.call('GET', `/blog/posts/${postId}/reactions`)
    expect(counts.status).toBe(200)
    expect(counts.body.data).toEqual({ like: 2, insightful: 1, helpful: 1, total: 4 })
  })

  test('a reactor takes a reaction back with DELETE and the same body: 200 with the counts, again no change', async () => {
    // As the original service's blog skill (stamnhq/skills, stamn-blog) has agents do it, by X-API-Key.
    const post = await writePost(ctx, agents[2]!, { title: 'Taken Back', publish: true })
    const path = `/blog/posts/${post.id}/reactions`
    const agent = { headers: { 'x-api-key': agents[0]!.apiKey } }
    await ctx.call('POST', path, { ...agent, body: { type: 'like' } })
    await ctx.call('POST', path, { ...agent, body: { type: 'helpful' } })
    await ctx.call('POST', path, { token: reader.token, body: { type: 'like' } })
    const taken = await ctx.call('DELETE', path, { ...agent, body: { type: 'like' } })
    expect(taken.status).toBe(200)
    expect(taken.body).toEqual({ success: true, data: { like: 1, insightful: 0, helpful: 1, total: 2 } })
    const again = await ctx.call('DELETE', path, { ...agent, body: { type: 'like' } })
    expect(again.status).toBe(200)
    expect(again.body.data).toEqual({ like: 1, insightful: 0, helpful: 1, total: 2 })
    // Only the caller's own: the agent's helpful stays when the reader, who gave none, takes one back.
    expect((await ctx.call('DELETE', path, { token: reader.token, body: { type: 'helpful' } })).body.data).toEqual(again.body.data)
    expect((await ctx.call('DELETE', path, { token: reader.token, body: { type: 'like' } })).body.data).toEqual({
      like: 0,
      insightful: 0,
      helpful: 1,
      total: 1,
    })
    // Given again after that, it counts again.
    expect((await ctx.call('POST', path, { ...agent, body: { type: 'like' } })).status).toBe(201)
    expectError(await ctx.call('DELETE', path, { body: { type: 'like' } }), 401, 'unauthorized')
    expectError(await ctx.call('DELETE', path, { token: reader.token, body: { type: 'love' } }), 400, 'validation_failed')
    expectError(await ctx.call('DELETE', path, { token: reader.token }), 400, 'validation_failed')
    expectError(await ctx.call('DELETE', `/blog/posts/${hiddenIds[0]}/reactions`, { token: reader.token, body: { type: 'like' } }), 404, 'not_found')
  })

  test('racing duplicates count once', async () => {
    const racer = await signUp(ctx)
    const results = await Promise.all(
      Array.from({ length: 5 }, () => ctx.call('POST', `/blog/posts/${postId}/reactions`, { token: racer.token, body: { type: 'helpful' } })),
    )
    expect(results.map(res => res.status).sort()).toEqual([200, 200, 200, 200, 201])
    const [row] = await ctx.deps.sql<{ n: number }[]>`
      select count(*)::int as n from blog_reactions where post_id = ${postId} and user_id = ${racer.id}
    `
    expect(row!.n).toBe(1)
  })

  test('a bad type is 400, no credential 401, an unknown or unpublished post 404', async () => {
    for (const body of [{ type: 'love' }, {}, { type: 'like', extra: 1 }]) {
      expectError(await ctx.call('POST', `/blog/posts/${postId}/reactions`, { token: reader.token, body }), 400, 'validation_failed')
    }
    expectError(await ctx.call('POST', `/blog/posts/${postId}/reactions`, { body: { type: 'like' } }), 401, 'unauthorized')
    const unknown = '00000000-0000-4000-8000-000000000000'
    expectError(await ctx.call('POST', `/blog/posts/${unknown}/reactions`, { token: reader.token, body: { type: 'like' } }), 404, 'not_found')
    expectError(await ctx.call('GET', `/blog/posts/${unknown}/reactions`), 404, 'not_found')
    expectError(await ctx.call('GET', '/blog/posts/nope/reactions'), 400, 'validation_failed')
    const draft = hiddenIds[0]!
    expectError(await ctx.call('POST', `/blog/posts/${draft}/reactions`, { token: reader.token, body: { type: 'like' } }), 404, 'not_found')
    expectError(await ctx.call('GET', `/blog/posts/${draft}/reactions`), 404, 'not_found')
  })

  test('a reaction to a post deleted after the visibility check is 404, not a server error', async () => {
    const reactor = { kind: 'user' as const, userId: reader.id, keyId: null }
    const gone = '00000000-0000-4000-8000-000000000000'
    await expect(addReaction(ctx.deps.sql, gone, reactor, 'like', ctx.clock.now())).rejects.toMatchObject({ status: 404, code: 'not_found' })
  })

  test('a post’s counts, and the deletion of its reactions with it, find them by post, not by reading every reaction', async () => {
    // Statistics of a busy blog, analysed: 4,000 reactions to 200 posts (drafts here, out of the
    // feeds). The unique indexes that lead with the post are partial, one kind of reactor each, which
    // neither statement can use.
    const tag = randomUUID().slice(0, 8)
    const users = await ctx.deps.sql<{ id: string }[]>`
      insert into users (provider_id) select ${tag} || '-' || i from generate_series(1, 20) i returning id
    `
    const at = ctx.clock.now()
    const posts = await ctx.deps.sql<{ id: string }[]>`
      insert into blog_posts (participant_id, title, slug, content, status, created_at, updated_at)
      select ${agents[2]!.id}, 'Post', ${tag} || '-' || n, 'Text', 'draft', ${at}, ${at} from generate_series(1, 200) n
      returning id
    `
    await ctx.deps.sql`
      insert into blog_reactions (post_id, user_id, type, created_at)
      select p, u, 'like', ${at} from unnest(${posts.map(p => p.id)}::uuid[]) p, unnest(${users.map(u => u.id)}::uuid[]) u
    `
    await ctx.deps.sql`analyze blog_reactions`
    await ctx.deps.sql`analyze blog_reaction_counts`
    // The counts are kept by post (migration 00025): read by its key.
    const counts = await ctx.deps.sql<{ 'QUERY PLAN': string }[]>`explain ${reactionCounts(ctx.deps.sql, posts[0]!.id)}`
    // What the foreign key's cascade runs for each post deleted.
    const cascade = await ctx.deps.sql<{ 'QUERY PLAN': string }[]>`explain delete from blog_reactions where post_id = ${posts[0]!.id}`
    for (const [rows, index] of [
      [counts, 'blog_reaction_counts_pkey'],
      [cascade, 'blog_reactions_by_post'],
    ] as const) {
      const plan = rows.map(row => row['QUERY PLAN']).join('\n')
      expect(plan).toContain(index)
      expect(plan).not.toContain('Seq Scan')
    }
    await ctx.deps.sql`delete from blog_posts where id = any(${posts.map(p => p.id)}::uuid[])`
  })

  test('a post’s public counts read one row however many reactions it has, and follow every write', async () => {
    // 100 users' three reactions each, written straight to the table as any release would.
    const post = await writePost(ctx, agents[2]!, { title: 'Popular', publish: true })
    const tag = randomUUID().slice(0, 8)
    const users = await ctx.deps.sql<{ id: string }[]>`
      insert into users (provider_id) select ${tag} || '-' || i from generate_series(1, 100) i returning id
    `
    await ctx.deps.sql`
      insert into blog_reactions (post_id, user_id, type, created_at)
      select ${post.id}, u, t, now() from unnest(${users.map(u => u.id)}::uuid[]) u, unnest(array['like', 'insightful', 'helpful']) t
    `
    const counts = () => ctx.call('GET', `/blog/posts/${post.id}/reactions`).then(res => res.body.data)
    expect(await counts()).toEqual({ like: 100, insightful: 100, helpful: 100, total: 300 })
    // What one anonymous GET makes Postgres read for them: one row, not the post's 300 reactions.
    const [explained] = await ctx.deps.sql<{ 'QUERY PLAN': [{ Plan: PlanNode }] }[]>`
      explain (analyze, format json) ${reactionCounts(ctx.deps.sql, post.id)}
    `
    expect(rowsRead(explained!['QUERY PLAN'][0].Plan)).toBeLessThanOrEqual(1)
    // Adds, repeats, take-backs and deletions through the API and straight in the table.
    await ctx.call('POST', `/blog/posts/${post.id}/reactions`, { token: reader.token, body: { type: 'like' } })
    await ctx.call('POST', `/blog/posts/${post.id}/reactions`, { token: reader.token, body: { type: 'like' } })
    await ctx.call('DELETE', `/blog/posts/${post.id}/reactions`, { token: reader.token, body: { type: 'helpful' } })
    await ctx.call('POST', `/blog/posts/${post.id}/reactions`, { apiKey: agents[0]!.apiKey, body: { type: 'helpful' } })
    await ctx.deps.sql`delete from blog_reactions where post_id = ${post.id} and user_id = ${users[0]!.id}`
    expect(await counts()).toEqual({ like: 100, insightful: 99, helpful: 100, total: 299 })
    await ctx.call('DELETE', `/blog/posts/${post.id}/reactions`, { apiKey: agents[0]!.apiKey, body: { type: 'helpful' } })
    expect(await counts()).toEqual({ like: 100, insightful: 99, helpful: 99, total: 298 })
    // A post without reactions counts none.
    const quiet = await writePost(ctx, agents[2]!, { title: 'Quiet', publish: true })
    expect((await ctx.call('GET', `/blog/posts/${quiet.id}/reactions`)).body.data).toEqual({ like: 0, insightful: 0, helpful: 0, total: 0 })
  })

  test('deleting a post deletes its reactions', async () => {
    const post = await writePost(ctx, agents[2]!, { title: 'Brief', publish: true })
    await ctx.call('POST', `/blog/posts/${post.id}/reactions`, { token: reader.token, body: { type: 'like' } })
    await ctx.call('DELETE', `/blog/posts/${post.id}`, { apiKey: agents[2]!.apiKey })
    const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_reactions where post_id = ${post.id}`
    expect(row!.n).toBe(0)
  })
})
