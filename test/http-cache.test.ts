/**
 * Caches between the API and its callers: nginx's `proxy_cache` in front, as operators configure it
 * (the default key, `proxy_cache_valid 200 1m`, and `any 1m`, which keeps errors too), must never give
 * one caller another's answer; the public blog documents are cached, carry an ETag and are answered
 * 304 while unchanged; every other answer, errors and streams included, says `no-store`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, signUp, subscribedPair, type TestContext } from './helpers/context.ts'
import { documented, startNginx, type Nginx } from './helpers/nginx.ts'
import { blogAgent, writePost } from './helpers/blog.ts'

const dashboard = 'https://app.example.com'
let ctx: TestContext
let api: ReturnType<TestContext['app']['listen']>
let apiUrl: string
/** Keeps a 200 a minute, as operators commonly configure a cache in front of an API. */
let okCache: Nginx
/** Keeps every answer a minute, errors included. */
let anyCache: Nginx

const cached = (valid: string) => `${documented.location}
      proxy_cache api;
      ${valid}
      add_header X-Cache-Status $upstream_cache_status always;`

beforeAll(async () => {
  ctx = await createTestContext({ actors: true, env: { CORS_ORIGINS: dashboard } })
  api = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  const port = api.server!.port!
  apiUrl = `http://127.0.0.1:${port}`
  okCache = await startNginx([port], { cache: true, location: cached('proxy_cache_valid 200 1m;') })
  anyCache = await startNginx([port], { cache: true, location: cached('proxy_cache_valid any 1m;') })
  // Installing nginx, when it is missing, takes a while.
}, 600_000)
afterAll(async () => {
  await okCache?.stop()
  await anyCache?.stop()
  await api?.stop()
  await ctx?.close()
})

interface Answer {
  status: number
  /** nginx's $upstream_cache_status: MISS, HIT, EXPIRED...; null when the cache was not used. */
  cache: string | null
  headers: Headers
  text: string
}

async function get(base: string, path: string, headers: Record<string, string> = {}, method = 'GET'): Promise<Answer> {
  const response = await fetch(`${base}${path}`, { method, headers })
  return { status: response.status, cache: response.headers.get('x-cache-status'), headers: response.headers, text: await response.text() }
}

const key = (apiKey: string) => ({ 'x-api-key': apiKey })
const bearer = (token: string) => ({ authorization: `Bearer ${token}` })

describe('behind nginx with proxy_cache', () => {
  test('no caller is ever given another caller’s answer: agents’ and users’ reads, by key or by bearer token', async () => {
    const owner = await signUp(ctx)
    const a = await subscribedPair(ctx, owner)
    const b = await subscribedPair(ctx, owner)
    const stranger = await createAgent(ctx, owner)
    expect((await ctx.call('POST', `/v1/conversations/${a.agent.id}/messages`, { token: a.user.token, body: { text: 'for A only' } })).status).toBe(
      201,
    )
    const request = await ctx.call('POST', '/v1/agent/service-requests', {
      apiKey: b.agent.apiKey,
      body: { targetAgentId: a.agent.id, input: 'B asks A' },
    })
    expect(request.status).toBe(201)
    expect((await ctx.call('POST', '/v1/auth/api-keys', { token: a.user.token, body: { name: 'A’s key' } })).status).toBe(201)
    // Each path asked by one caller, then by another whose answer differs (another agent's inbox, another
    // user's profile; a caller without the right to it, or without a credential).
    const cases: [string, Record<string, string>, Record<string, string>][] = [
      ['/v1/agent/events', key(a.agent.apiKey), key(b.agent.apiKey)],
      ['/v1/agent/status', key(a.agent.apiKey), key(stranger.apiKey)],
      [`/v1/agent/context?userId=${a.user.id}`, key(a.agent.apiKey), key(b.agent.apiKey)],
      [`/v1/agent/service-requests/${request.body.data.requestId}`, key(a.agent.apiKey), key(stranger.apiKey)],
      ['/v1/auth/me', bearer(a.user.token), bearer(b.user.token)],
      ['/v1/billing/subscriptions', bearer(a.user.token), bearer(b.user.token)],
      ['/v1/billing/invoices', bearer(a.user.token), {}],
      ['/v1/auth/api-keys', bearer(a.user.token), bearer(b.user.token)],
      ['/v1/participants', bearer(owner.token), bearer(a.user.token)],
      // The owner sees the agent's settings; anyone else does not.
      [`/v1/participants/${a.agent.id}`, bearer(owner.token), {}],
      [`/v1/conversations/${a.agent.id}/messages`, bearer(a.user.token), bearer(b.user.token)],
    ]
    for (const proxy of [okCache, anyCache]) {
      for (const [path, first, second] of cases) {
        const where = `${path} through proxy_cache_valid ${proxy === okCache ? '200' : 'any'}`
        const one = await get(proxy.url, path, first)
        expect(one.status, where).toBe(200)
        const two = await get(proxy.url, path, second)
        const direct = await get(apiUrl, path, second)
        expect(two.cache, where).not.toBe('HIT')
        expect({ status: two.status, text: two.text }, where).toEqual({ status: direct.status, text: direct.text })
        expect(two.text, where).not.toBe(one.text)
      }
    }
  })

  test('errors are never kept for others: a 401 without a credential, a 404 to a stranger', async () => {
    const owner = await signUp(ctx)
    const { agent, user } = await subscribedPair(ctx, owner)
    const stranger = await createAgent(ctx, owner)
    const request = await ctx.call('POST', '/v1/agent/service-requests', {
      apiKey: stranger.apiKey,
      body: { targetAgentId: agent.id, input: 'hello' },
    })
    const third = await createAgent(ctx, owner)
    const requestPath = `/v1/agent/service-requests/${request.body.data.requestId}`
    // Each one a fresh URL, so that nothing before this test is in the cache.
    const unauthorized = await get(anyCache.url, `/v1/billing/invoices?limit=7`)
    expect(unauthorized.status).toBe(401)
    expect((await get(anyCache.url, `/v1/billing/invoices?limit=7`, bearer(user.token))).status).toBe(200)
    expect((await get(anyCache.url, requestPath, key(third.apiKey))).status).toBe(404)
    expect((await get(anyCache.url, requestPath, key(agent.apiKey))).status).toBe(200)
  })

  test('a device’s poll, one URL asked again and again, reaches the API each time: pending, slow_down, the key once, then 404', async () => {
    const user = await signUp(ctx)
    const started = await ctx.call('POST', '/v1/auth/device-codes')
    const pollPath = `/v1/auth/device-codes/${started.body.data.deviceCode}`
    const pending = await get(okCache.url, pollPath)
    expect([pending.status, JSON.parse(pending.text).data]).toEqual([200, { status: 'pending' }])
    const tooSoon = await get(anyCache.url, pollPath)
    expect([tooSoon.status, tooSoon.cache, tooSoon.headers.get('retry-after')]).toEqual([429, 'MISS', '5'])
    expect((await ctx.call('PATCH', `/v1/auth/device-codes/${started.body.data.userCode}`, { token: user.token })).status).toBe(200)
    ctx.clock.advance(5000)
    const approved = await get(okCache.url, pollPath)
    expect(JSON.parse(approved.text).data).toMatchObject({ status: 'approved', apiKey: expect.stringMatching(/^sk_usr_/) })
    ctx.clock.advance(5000)
    // Delivered once: the key is not kept to be handed out again.
    expect((await get(okCache.url, pollPath)).status).toBe(404)
    expect((await get(anyCache.url, pollPath)).status).toBe(404)
  })

  test('the public blog is cached and revalidated: a poll with its ETag is 304 from nginx, the one post page reaches the API each time', async () => {
    const owner = await signUp(ctx)
    const agent = await blogAgent(ctx, owner)
    await writePost(ctx, agent, { title: 'Cached', publish: true })
    for (const path of ['/blog/feed.xml', '/blog/feed', `/blog/${agent.name}/rss`, `/blog/${agent.name}/posts`, `/@${agent.name}/blog`]) {
      const first = await get(okCache.url, path)
      expect([first.status, first.cache, first.headers.get('cache-control')], path).toEqual([200, 'MISS', 'public, max-age=60'])
      const again = await get(okCache.url, path)
      expect([again.status, again.cache, again.text], path).toEqual([200, 'HIT', first.text])
      const revalidated = await get(okCache.url, path, { 'if-none-match': first.headers.get('etag')! })
      expect([revalidated.status, revalidated.text], path).toEqual([304, ''])
    }
    // A post's page counts a view on each read: no cache answers it without asking the API, which
    // answers 304 to a browser that has it (nginx, caching, drops the condition and keeps nothing).
    const page = `/@${agent.name}/blog/cached`
    const first = await get(okCache.url, page)
    expect([first.status, first.headers.get('cache-control')]).toEqual([200, 'no-cache'])
    expect((await get(okCache.url, page)).cache).not.toBe('HIT')
    expect((await get(apiUrl, page, { 'if-none-match': first.headers.get('etag')! })).status).toBe(304)
    const post = await ctx.call('GET', `/blog/${agent.name}/posts/cached`)
    expect(post.body.data.viewCount).toBe(4)
    expect(post.headers.get('cache-control')).toBe('no-store')
  })
})

describe('what every answer says to caches', () => {
  const handle = (path: string, init: RequestInit = {}) => ctx.app.handle(new Request(`http://test.local${path}`, init))

  test('no-store on every answer but the public documents: a route’s, an error’s, a refusal at the door’s, a stream’s', async () => {
    const owner = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const answers: [string, Response][] = [
      ['poll', await handle('/v1/agent/events', { headers: key(agent.apiKey) })],
      ['sse token', await handle('/v1/auth/sse-token', { method: 'POST', headers: bearer(owner.token) })],
      ['401', await handle('/v1/auth/me')],
      ['404 route', await handle('/nowhere')],
      ['405', await handle('/v1/auth/me', { method: 'PUT' })],
      ['414', await handle(`/v1/auth/me?${'x'.repeat(9000)}`)],
      [
        '413',
        await handle('/v1/participants', {
          method: 'POST',
          headers: { ...bearer(owner.token), 'content-type': 'application/json' },
          body: 'x'.repeat(1024 * 1024 + 1),
        }),
      ],
      ['OPTIONS', await handle('/v1/auth/me', { method: 'OPTIONS', headers: { origin: dashboard, 'access-control-request-method': 'GET' } })],
      ['HTML 404', await handle('/@nobody-here/blog')],
      ['swagger document', await handle('/swagger/json')],
    ]
    for (const [what, response] of answers) expect(response.headers.get('cache-control'), what).toBe('no-store')
    const stream = await handle('/v1/events/chat', { method: 'HEAD' })
    expect(stream.headers.get('cache-control')).toBe('no-store, no-transform')
    // What the Swagger UI loads is the same for everyone, and says so itself.
    expect((await handle('/swagger/assets/init.js')).headers.get('cache-control')).toBe('public, max-age=3600')
  })

  test('a public document’s ETag changes with any change to it, and a 304 carries ETag, Cache-Control and Vary, no body and no type', async () => {
    const owner = await signUp(ctx)
    const agent = await blogAgent(ctx, owner)
    const post = await writePost(ctx, agent, { title: 'First', content: 'One.', publish: true })
    const path = `/blog/${agent.name}/rss`
    const before = await handle(path)
    const etag = before.headers.get('etag')!
    expect(etag).toMatch(/^"[A-Za-z0-9_-]{22}"$/)
    // An edit of the content alone (the title, the date and the list stay) is a new document.
    expect((await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { content: 'Two.' } })).status).toBe(200)
    const changed = await handle(path, { headers: { 'if-none-match': etag } })
    expect(changed.status).toBe(200)
    expect(await changed.text()).toContain('Two.')
    const current = changed.headers.get('etag')!
    expect(current).not.toBe(etag)

    const notModified = await handle(path, { headers: { 'if-none-match': `"other", W/${current}`, origin: dashboard } })
    expect(notModified.status).toBe(304)
    expect(await notModified.text()).toBe('')
    expect(notModified.headers.get('etag')).toBe(current)
    expect(notModified.headers.get('cache-control')).toBe('public, max-age=60')
    expect(notModified.headers.get('vary')).toBe('Origin')
    expect(notModified.headers.get('access-control-allow-origin')).toBe(dashboard)
    expect(notModified.headers.get('content-type')).toBeNull()
    expect((await handle(path, { method: 'HEAD', headers: { 'if-none-match': current } })).status).toBe(304)
    expect((await handle(path, { headers: { 'if-none-match': '*' } })).status).toBe(304)
    // Unpublished, the document is another; and a 404 is never stored.
    expect((await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { status: 'draft' } })).status).toBe(200)
    expect((await handle(path, { headers: { 'if-none-match': current } })).status).toBe(200)
    const gone = await handle(`/@${agent.name}/blog/first`, { headers: { 'if-none-match': '*' } })
    expect([gone.status, gone.headers.get('cache-control'), gone.headers.get('etag')]).toEqual([404, 'no-store', null])
  })

  test('the OpenAPI document describes the caching of exactly the documents that are cacheable', async () => {
    const document = (await ctx.call('GET', '/swagger/json')).body
    const cacheable: Record<string, string> = {}
    for (const [path, item] of Object.entries<any>(document.paths)) {
      for (const operation of Object.values<any>(item)) {
        if (!operation.responses['304']) continue
        expect(operation.responses['200'].headers, path).toHaveProperty('ETag')
        cacheable[operation.operationId] = operation.responses['200'].headers['Cache-Control'].schema.const
      }
    }
    expect(cacheable).toEqual({
      getBlogFeed: 'public, max-age=60',
      getBlogFeedRss: 'public, max-age=60',
      listAgentBlogPosts: 'public, max-age=60',
      getAgentBlogRss: 'public, max-age=60',
      getAgentBlogPage: 'public, max-age=60',
      getAgentBlogPostPage: 'no-cache',
    })
  })
})
