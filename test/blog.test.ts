/** Writing a blog: who may write, field limits, slugs, a renderer that fails. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { blogAgent, brokenRenderer, setBlog, writePost } from './helpers/blog.ts'
import { createLog } from '../src/log.ts'
import { candidate, slugify } from '../src/blog/slug.ts'

let ctx: TestContext
let owner: TestUser
let stranger: TestUser
let agent: TestAgent
let otherAgent: TestAgent

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  stranger = await signUp(ctx)
  agent = await blogAgent(ctx, owner)
  otherAgent = await blogAgent(ctx, stranger)
})
afterAll(() => ctx.close())

const publicPost = (name: string, slug: string) => ctx.call('GET', `/blog/${name}/posts/${slug}`)

describe('who may write', () => {
  test('the owner writes with a bearer token naming the agent: 201 with the whole post', async () => {
    const res = await ctx.call('POST', '/blog/posts', {
      token: owner.token,
      body: { participantId: agent.id, title: 'First Words', content: '# Hi\n\nBody', excerpt: 'Short', tags: ['intro', 'ai'] },
    })
    expect(res.status).toBe(201)
    const post = res.body.data
    expect(post).toEqual({
      id: expect.stringMatching(/^[0-9a-f-]{36}$/),
      participantId: agent.id,
      agentName: agent.name,
      title: 'First Words',
      slug: 'first-words',
      content: '# Hi\n\nBody',
      excerpt: 'Short',
      tags: ['intro', 'ai'],
      status: 'draft',
      publishAt: null,
      publishedAt: null,
      viewCount: 0,
      url: `http://test.local/@${agent.name}/blog/first-words`,
      createdAt: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/),
      updatedAt: post.createdAt,
    })
  })

  test('the agent writes with its own key, by X-API-Key or Bearer, with or without participantId', async () => {
    const byHeader = await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'By key', content: 'x' } })
    expect(byHeader.status).toBe(201)
    expect(byHeader.body.data.participantId).toBe(agent.id)
    const byBearer = await ctx.call('POST', '/blog/posts', {
      token: agent.apiKey,
      body: { participantId: agent.id, title: 'By bearer', content: 'x' },
    })
    expect(byBearer.status).toBe(201)
    expect(byBearer.body.data.participantId).toBe(agent.id)
  })

  test('a user credential must name the agent: 400 without participantId, 404 for an unknown agent', async () => {
    const missing = expectError(
      await ctx.call('POST', '/blog/posts', { token: owner.token, body: { title: 't', content: 'x' } }),
      400,
      'validation_failed',
    )
    expect(missing.details).toEqual([{ path: '/participantId', message: expect.any(String) }])
    expectError(
      await ctx.call('POST', '/blog/posts', {
        token: owner.token,
        body: { participantId: '00000000-0000-4000-8000-000000000000', title: 't', content: 'x' },
      }),
      404,
      'not_found',
    )
  })

  test('another user, another agent’s key and no credential cannot create: 403, 403, 401', async () => {
    const body = { participantId: agent.id, title: 'Hijack', content: 'x' }
    expectError(await ctx.call('POST', '/blog/posts', { token: stranger.token, body }), 403, 'forbidden')
    expectError(await ctx.call('POST', '/blog/posts', { apiKey: otherAgent.apiKey, body }), 403, 'forbidden')
    expectError(await ctx.call('POST', '/blog/posts', { body }), 401, 'unauthorized')
    expectError(await ctx.call('POST', '/blog/posts', { apiKey: 'sk_agt_bogus', body }), 401, 'invalid_token')
    const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts where title = 'Hijack'`
    expect(row!.n).toBe(0)
  })

  test('only writers read, change and delete a post: others 403, no credential 401, the agent and owner 200', async () => {
    const post = await writePost(ctx, agent, { title: 'Guarded' })
    const path = `/blog/posts/${post.id}`
    for (const credential of [{ token: stranger.token }, { apiKey: otherAgent.apiKey }]) {
      expectError(await ctx.call('GET', path, credential), 403, 'forbidden')
      expectError(await ctx.call('PATCH', path, { ...credential, body: { title: 'Taken' } }), 403, 'forbidden')
      expectError(await ctx.call('DELETE', path, credential), 403, 'forbidden')
      expectError(await ctx.call('GET', `/blog/manage/${agent.id}`, credential), 403, 'forbidden')
    }
    expectError(await ctx.call('GET', path), 401, 'unauthorized')
    expectError(await ctx.call('PATCH', path, { body: { title: 'Taken' } }), 401, 'unauthorized')
    expectError(await ctx.call('DELETE', path), 401, 'unauthorized')
    expect((await ctx.call('GET', path, { token: owner.token })).body.data.title).toBe('Guarded')
    expect((await ctx.call('GET', path, { apiKey: agent.apiKey })).body.data.title).toBe('Guarded')
    expect((await ctx.call('PATCH', path, { token: owner.token, body: { title: 'Owner edit' } })).status).toBe(200)
    expect((await ctx.call('PATCH', path, { apiKey: agent.apiKey, body: { content: 'Agent edit' } })).body.data).toMatchObject({
      title: 'Owner edit',
      content: 'Agent edit',
    })
    expectError(await ctx.call('GET', '/blog/posts/00000000-0000-4000-8000-000000000000', { token: owner.token }), 404, 'not_found')
    expectError(await ctx.call('GET', '/blog/posts/not-a-uuid', { token: owner.token }), 400, 'validation_failed')
  })

  test('blog not enabled: 403 blog_disabled for create, update and delete; writers still read', async () => {
    const quiet = await createAgent(ctx, owner)
    const refused = expectError(
      await ctx.call('POST', '/blog/posts', { token: owner.token, body: { participantId: quiet.id, title: 't', content: 'x' } }),
      403,
      'blog_disabled',
    )
    // It says what to do: the setting, and where it is changed. It opens with the contract's words, which
    // the original service's blog skill (stamnhq/skills, stamn-blog) tells agents to look for.
    expect(refused.message).toStartWith('Blog is not enabled')
    expect(refused.message).toContain('settings.blogEnabled')
    expect(refused.message).toContain('PATCH /v1/participants/{id}')
    expectError(await ctx.call('POST', '/blog/posts', { apiKey: quiet.apiKey, body: { title: 't', content: 'x' } }), 403, 'blog_disabled')
    await setBlog(ctx, owner, quiet, { blogEnabled: true })
    const post = await writePost(ctx, quiet, { title: 'Before the switch' })
    await setBlog(ctx, owner, quiet, { blogEnabled: false })
    expectError(await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: quiet.apiKey, body: { title: 'x' } }), 403, 'blog_disabled')
    expectError(await ctx.call('DELETE', `/blog/posts/${post.id}`, { token: owner.token }), 403, 'blog_disabled')
    expect((await ctx.call('GET', `/blog/posts/${post.id}`, { token: owner.token })).status).toBe(200)
    expect((await ctx.call('GET', `/blog/manage/${quiet.id}`, { apiKey: quiet.apiKey })).body.data).toHaveLength(1)
  })
})

describe('field limits', () => {
  const long = (n: number) => 'x'.repeat(n)

  test.each([
    ['title', 'empty', ''],
    ['title', 'blank', '   '],
    ['title', '201 characters', long(201)],
    ['content', 'empty', ''],
    ['content', '100,001 characters', long(100_001)],
    ['excerpt', '501 characters', long(501)],
    ['tags', '11 of them', Array.from({ length: 11 }, (_, i) => `t${i}`)],
    ['tags', 'with an empty one', ['']],
    ['tags', 'with one of 33 characters', [long(33)]],
    ['tags', 'with a blank end', [' padded']],
    ['tags', 'not a list', 'not-a-list'],
    ['publish', 'a string', 'yes'],
    ['publishAt', 'not a time', 'tomorrow'],
    ['publishAt', 'in the past', '2020-01-01T00:00:00.000Z'],
    ['publishAt', 'not a real day', '2030-02-30T00:00:00.000Z'],
    ['publishAt', 'more than 366 days ahead', new Date(Date.now() + 367 * 86_400_000).toISOString()],
    ['title', 'with a NUL character', 'a\u0000b'],
    ['content', 'with a NUL character', 'x\u0000'],
    ['excerpt', 'with a NUL character', '\u0000'],
    ['tags', 'with a NUL character', ['a\u0000']],
    ['participantId', 'not a uuid', 'not-a-uuid'],
    ['unknown', 'an unknown field', true],
  ])('refuses %s %s with 400 naming the field, and writes nothing', async (field, _label, value) => {
    const before = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts`
    const body = expectError(
      await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Limits', content: 'x', [field]: value } }),
      400,
      'validation_failed',
    )
    expect(body.details.map((detail: { path: string }) => detail.path.split('/').slice(0, 2).join('/'))).toContain(`/${field}`)
    const after = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts`
    expect(after[0]!.n).toBe(before[0]!.n)
  })

  test('accepts every field at its limit', async () => {
    const res = await ctx.call('POST', '/blog/posts', {
      apiKey: agent.apiKey,
      body: {
        title: long(200),
        content: long(100_000),
        excerpt: long(500),
        tags: Array.from({ length: 10 }, (_, i) => `${i}${long(31)}`),
      },
    })
    expect(res.status).toBe(201)
    expect(res.body.data.content).toHaveLength(100_000)
    expect(res.body.data.tags).toHaveLength(10)
  })

  test('repeated tags are kept once, in order', async () => {
    const post = await writePost(ctx, agent, { title: 'Tags', tags: ['b', 'a', 'b', 'a', 'c'] })
    expect(post.tags).toEqual(['b', 'a', 'c'])
  })

  test('publish and publishAt together are 400; so are status and publishAt, and bad PATCH fields', async () => {
    const soon = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    expectError(
      await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 't', content: 'x', publish: true, publishAt: soon } }),
      400,
      'validation_failed',
    )
    const post = await writePost(ctx, agent, { title: 'Patch limits' })
    const patch = (body: unknown) => ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body })
    expectError(await patch({ status: 'published', publishAt: soon }), 400, 'validation_failed')
    expectError(await patch({ status: 'scheduled' }), 400, 'validation_failed')
    expectError(await patch({ title: long(201) }), 400, 'validation_failed')
    expectError(await patch({ content: '' }), 400, 'validation_failed')
    expectError(await patch({ participantId: agent.id }), 400, 'validation_failed')
    expectError(await patch({ publishAt: '2020-01-01T00:00:00Z' }), 400, 'validation_failed')
    expect((await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data.status).toBe('draft')
  })
})

describe('slugs', () => {
  test.each([
    ['Hello, World!', 'hello-world'],
    ['  --Already--Hyphenated--  ', 'already-hyphenated'],
    ['C++ & Rust: 10x faster?', 'c-rust-10x-faster'],
    ['Ünïcödé — Straße 2026', 'n-c-d-stra-e-2026'],
    ['日本語のタイトル', 'post'],
    ['!!!', 'post'],
    ['MiXeD CaSe 42', 'mixed-case-42'],
    ['tab\tand\nnewline', 'tab-and-newline'],
  ])('%p becomes %p', async (title, slug) => {
    const post = await writePost(ctx, otherAgent, { title })
    expect(post.slug).toMatch(new RegExp(`^${slug}(-[0-9]+)?$`))
    expect(slugify(title)).toBe(slug)
  })

  test('long titles give at most 80 characters, never ending in a hyphen, suffixes included', async () => {
    const title = `${'word '.repeat(15)}end-of-the-long-title`
    const first = await writePost(ctx, otherAgent, { title })
    const second = await writePost(ctx, otherAgent, { title })
    expect(first.slug.length).toBeLessThanOrEqual(80)
    expect(second.slug.length).toBeLessThanOrEqual(80)
    expect(first.slug).not.toMatch(/-$/)
    expect(second.slug).toMatch(/-2$/)
    expect(candidate('a'.repeat(80), 10)).toBe(`${'a'.repeat(77)}-10`)
  })

  test('the same title gets -2, -3 within one agent, and no suffix at another agent', async () => {
    const slugs = []
    for (let i = 0; i < 3; i++) slugs.push((await writePost(ctx, agent, { title: 'Same Title' })).slug)
    expect(slugs).toEqual(['same-title', 'same-title-2', 'same-title-3'])
    expect((await writePost(ctx, otherAgent, { title: 'Same Title' })).slug).toBe('same-title')
  })

  test('writers racing for one title each get their own slug, thirty at once too, and drafts renamed at once', async () => {
    const results = await Promise.all(
      Array.from({ length: 30 }, () => ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Race Day', content: 'x' } })),
    )
    expect(results.map(res => res.status)).toEqual(Array.from({ length: 30 }, () => 201))
    expect(results.map(res => res.body.data.slug).sort()).toEqual(['race-day', ...Array.from({ length: 29 }, (_, i) => `race-day-${i + 2}`)].sort())
    const drafts = await Promise.all(Array.from({ length: 11 }, (_, i) => writePost(ctx, agent, { title: `Draft ${i}` })))
    const renamed = await Promise.all(
      drafts.map(draft => ctx.call('PATCH', `/blog/posts/${draft.id}`, { apiKey: agent.apiKey, body: { title: 'Renamed Together' } })),
    )
    expect(renamed.map(res => res.status)).toEqual(Array.from({ length: 11 }, () => 200))
    expect(new Set(renamed.map(res => res.body.data.slug)).size).toBe(11)
  })

  test('a draft’s slug follows its title; once published it stays, even back in draft', async () => {
    const post = await writePost(ctx, agent, { title: 'Working Title' })
    const renamed = await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { title: 'Final Title' } })
    expect(renamed.body.data.slug).toBe('final-title')
    const published = await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { status: 'published' } })
    expect(published.body.data.slug).toBe('final-title')
    const retitled = await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { title: 'A Better Title' } })
    expect(retitled.body.data).toMatchObject({ title: 'A Better Title', slug: 'final-title', status: 'published' })
    expect((await publicPost(agent.name, 'final-title')).body.data.title).toBe('A Better Title')
    await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { status: 'draft' } })
    const draftAgain = await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { title: 'Yet Another' } })
    expect(draftAgain.body.data.slug).toBe('final-title')
  })

  test('a post published on creation keeps its slug on a title change', async () => {
    const post = await writePost(ctx, agent, { title: 'Launch Notes', publish: true })
    const res = await ctx.call('PATCH', `/blog/posts/${post.id}`, { token: owner.token, body: { title: 'Launch Notes, Revised' } })
    expect(res.body.data.slug).toBe('launch-notes')
  })
})

describe('a renderer that fails', () => {
  test('its thread cannot load (a broken deploy): writes are 503 unavailable, never 500, and nothing is written', async () => {
    const post = await writePost(ctx, agent, { title: 'Before the deploy' })
    const working = ctx.deps.markdown
    ctx.deps.markdown = brokenRenderer(createLog('error', () => {}))
    try {
      // The first write waits for the thread, which then fails; later ones are refused at once.
      for (const title of ['After the deploy', 'Again']) {
        expectError(await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title, content: 'x' } }), 503, 'unavailable')
      }
      expectError(await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { content: 'y' } }), 503, 'unavailable')
      const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts where title in ('After the deploy', 'Again')`
      expect(row!.n).toBe(0)
    } finally {
      await ctx.deps.markdown.close()
      ctx.deps.markdown = working
    }
  })
})
