/**
 * Caches between the API and its callers: nginx's `proxy_cache` in front, as operators configure it
 * (the default key, `proxy_cache_valid 200 1m`, and `any 1m`, which keeps errors too), must never give
 * one caller another's answer; every answer, errors and streams included, says `no-store`.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, signUp, subscribedPair, type TestContext } from './helpers/context.ts'
import { documented, startNginx, type Nginx } from './helpers/nginx.ts'

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
})

describe('what every answer says to caches', () => {
  const handle = (path: string, init: RequestInit = {}) => ctx.app.handle(new Request(`http://test.local${path}`, init))

  test('no-store on every answer: a route’s, an error’s, a refusal at the door’s, a stream’s', async () => {
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
})
