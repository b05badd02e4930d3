import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import SwaggerParser from '@apidevtools/swagger-parser'
import { callApp, createTestContext, expectError, redisUrl, signUp, type CallResult, type TestContext, type TestUser } from './helpers/context.ts'
import { createApp } from '../src/app.ts'
import { createTestDatabase } from './helpers/database.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { createLog } from '../src/log.ts'
import { Elysia, t } from 'elysia'
import { httpErrors } from '../src/http/error-handler.ts'
import { routeMethods } from '../src/http/route-methods.ts'
import { serverOptions } from '../src/http/server-options.ts'
import { accepted } from '../src/actors/refusal.ts'

let ctx: TestContext
let alice: TestUser

beforeAll(async () => {
  ctx = await createTestContext()
  alice = await signUp(ctx, 'alice')
})
afterAll(() => ctx.close())

const oneMiB = 1024 * 1024

/** Sends a body with an explicit content-length, as most clients do. */
async function send(path: string, body: string, headers: Record<string, string> = {}) {
  return ctx.call('POST', path, {
    rawBody: body,
    headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), ...headers },
  })
}

/** What a client must never see in an error: a stack trace, SQL text, or the framework's raw dump. */
function expectClean(result: CallResult) {
  const body = result.body
  expect(typeof body).toBe('object')
  for (const key of ['type', 'schema', 'found', 'errors', 'stack', 'on', 'property', 'expected']) {
    expect(body).not.toHaveProperty(key)
  }
  expect(Object.keys(body).sort()).toEqual(
    body.details ? ['details', 'error', 'message', 'statusCode', 'success'] : ['error', 'message', 'statusCode', 'success'],
  )
  const text = JSON.stringify(body)
  expect(text).not.toMatch(/\n\s*at /)
  expect(text).not.toMatch(/\bat .+\.(ts|js):\d+/)
  expect(text.toLowerCase()).not.toMatch(/\b(select|insert|update|delete) .*\b(from|into|set|where)\b/)
  expect(body.message).not.toMatch(/^\s*at /m)
  expect(body.message.toLowerCase()).not.toContain('select')
}

describe('framework-level errors', () => {
  test('an unknown route is 404 not_found in the envelope', async () => {
    const res = await ctx.call('GET', '/v1/no-such-thing')
    expectError(res, 404, 'not_found')
    expectClean(res)
    expectError(await ctx.call('POST', '/nowhere', { body: {} }), 404, 'not_found')
  })

  test('a wrong method on a known path is 405 method_not_allowed in the envelope, with Allow', async () => {
    const id = crypto.randomUUID()
    for (const [method, path, allow] of [
      ['PUT', '/v1/auth/me', 'GET, HEAD, OPTIONS, PATCH'],
      ['DELETE', '/health', 'GET, HEAD, OPTIONS'],
      ['PUT', '/v1/participants', 'GET, HEAD, OPTIONS, POST'],
      ['PUT', `/v1/participants/${id}`, 'DELETE, GET, HEAD, OPTIONS, PATCH'],
      ['GET', `/v1/participants/${id}/api-key/`, 'OPTIONS, POST'],
      ['POST', '/@somebody/blog', 'GET, HEAD, OPTIONS'],
    ] as const) {
      const res = await ctx.call(method, path, { token: alice.token, body: {} })
      const error = expectError(res, 405, 'method_not_allowed')
      expectClean(res)
      expect(res.headers.get('allow'), `${method} ${path}`).toBe(allow)
      expect(error.message).toBe(`This path does not take ${method}; it takes ${allow}`)
    }
    // A method no route takes anywhere, and a path the service does not have, are told apart.
    expectError(await ctx.call('PUT', '/v1/no-such-thing', { body: {} }), 404, 'not_found')
    expect((await ctx.call('TRACE', '/health')).headers.get('allow')).toBe('GET, HEAD, OPTIONS')
  })

  test('HEAD answers where GET does, without a body; OPTIONS says which methods a path takes', async () => {
    const head = await ctx.app.handle(new Request('http://test.local/health', { method: 'HEAD' }))
    expect(head.status).toBe(200)
    expect(await head.text()).toBe('')
    expectError(await ctx.call('HEAD', '/v1/auth/device-codes'), 405, 'method_not_allowed')

    const options = await ctx.call('OPTIONS', '/v1/auth/me')
    expect(options.status).toBe(204)
    expect(options.headers.get('allow')).toBe('GET, HEAD, OPTIONS, PATCH')
    expect(options.body).toBe('')
    expect((await ctx.call('OPTIONS', `/blog/${alice.id}/posts/some-slug`)).headers.get('allow')).toBe('GET, HEAD, OPTIONS')
    expectError(await ctx.call('OPTIONS', '/v1/no-such-thing'), 404, 'not_found')
  })

  test('a form, multipart or text body is 415 unsupported_media_type naming JSON, and creates nothing', async () => {
    const name = `form-${Math.random().toString(36).slice(2, 10)}`
    const multipart = new FormData()
    multipart.append('name', name)
    const bodies: [string | URLSearchParams | FormData, Record<string, string>][] = [
      [new URLSearchParams({ name }), {}],
      [multipart, {}],
      [JSON.stringify({ name }), { 'content-type': 'text/plain' }],
      [JSON.stringify({ name }), {}],
    ]
    for (const [body, headers] of bodies) {
      const response = await ctx.app.handle(
        new Request('http://test.local/v1/participants', { method: 'POST', headers: { authorization: `Bearer ${alice.token}`, ...headers }, body }),
      )
      const result = { status: response.status, headers: response.headers, body: await response.json() }
      const error = expectError(result, 415, 'unsupported_media_type')
      expect(error.message).toBe('The request body must be JSON, sent with Content-Type: application/json')
      expectClean(result)
    }
    expect((await ctx.call('GET', `/v1/participants/${name}`)).status).toBe(404)
    // The route is looked at first: no such path is 404, a wrong method 405, whatever the body.
    const form = (method: string, path: string) =>
      ctx.app.handle(new Request(`http://test.local${path}`, { method, body: new URLSearchParams({ name }) }))
    expect((await form('POST', '/v1/no-such-thing')).status).toBe(404)
    expect((await form('PUT', '/v1/participants')).status).toBe(405)
    // No body at all needs no media type, and a route that takes no body does not read one, whatever its type.
    expect((await ctx.call('POST', '/v1/auth/sse-token', { token: alice.token })).status).toBe(200)
    const unread = await ctx.call('POST', '/v1/auth/sse-token', { token: alice.token, rawBody: 'hello', headers: { 'content-type': 'text/plain' } })
    expect(unread.status).toBe(200)
  })

  test('JSON in another charset than UTF-8, or under a content coding, is 415 saying so, and creates nothing', async () => {
    const name = `coded-${Math.random().toString(36).slice(2, 10)}`
    const cases: [Record<string, string>, string][] = [
      [{ 'content-type': 'application/json; charset=utf-16' }, 'UTF-8'],
      [{ 'content-type': 'application/json;charset="ISO-8859-1"' }, 'UTF-8'],
      [{ 'content-type': 'application/json', 'content-encoding': 'gzip' }, 'Content-Encoding'],
      [{ 'content-type': 'application/json', 'content-encoding': 'br' }, 'Content-Encoding'],
    ]
    for (const [headers, names] of cases) {
      const result = await ctx.call('POST', '/v1/participants', { token: alice.token, rawBody: JSON.stringify({ name }), headers })
      expect(expectError(result, 415, 'unsupported_media_type').message).toContain(names)
      // RFC 9110, 12.5.3: refused for its coding, the answer says which coding is taken.
      expect(result.headers.get('accept-encoding')).toBe(headers['content-encoding'] ? 'identity' : null)
    }
    expect((await ctx.call('GET', `/v1/participants/${name}`)).status).toBe(404)
    // UTF-8 said in any spelling, and the identity coding, are read.
    const read: Record<string, string>[] = [
      { 'content-type': 'application/json; charset=UTF-8' },
      { 'content-type': 'application/json; charset=utf8', 'content-encoding': 'identity' },
    ]
    for (const headers of read) {
      const made = await ctx.call('POST', '/v1/participants', {
        token: alice.token,
        rawBody: JSON.stringify({ name: `${name}-${headers['content-type']!.length}` }),
        headers,
      })
      expect(made.status).toBe(201)
    }
  })

  test('a route that takes no body reads none: broken JSON, a NUL or a deep body sent to it is answered as no body', async () => {
    const bodiless = ctx.app.routes.filter(route => !['GET', 'HEAD', 'OPTIONS'].includes(route.method) && !route.hooks.body)
    expect(bodiless.map(route => `${route.method} ${route.path}`)).toContain('POST /v1/auth/device-codes')
    for (const route of bodiless) {
      const path = route.path.replace(/:\w+/g, '3f2504e0-4f89-41d3-9a0c-0305e82c3301')
      const answer = async (rawBody?: string) => (await ctx.call(route.method, path, { token: alice.token, rawBody })).status
      const status = await answer()
      for (const body of ['{"broken', '{"a":"\\u0000"}', `${'['.repeat(100)}${']'.repeat(100)}`]) {
        expect([route.method, route.path, body.slice(0, 10), await answer(body)]).toEqual([route.method, route.path, body.slice(0, 10), status])
      }
    }
  })

  test('a GET or HEAD is answered without its body asked for (a stream made for nothing); a POST without a length is asked', async () => {
    const asked = (method: string, path: string, body?: string) => {
      const request = new Request(`http://test.local${path}`, { method, body })
      const descriptor = Object.getOwnPropertyDescriptor(Request.prototype, 'body')!
      let times = 0
      Object.defineProperty(request, 'body', { get: () => (times++, descriptor.get!.call(request)) })
      return { request, times: () => times }
    }
    for (const method of ['GET', 'HEAD']) {
      const { request, times } = asked(method, '/health/live')
      expect((await ctx.app.handle(request)).status).toBe(200)
      expect(times()).toBe(0)
    }
    const post = asked('POST', '/v1/participants', 'text')
    expect((await ctx.app.handle(post.request)).status).toBe(415)
    expect(post.times()).toBeGreaterThan(0)
  })

  test('a malformed JSON body is 400 invalid_json, before authentication', async () => {
    for (const token of [alice.token, undefined]) {
      const res = await ctx.call('POST', '/v1/participants', { token, rawBody: '{"name": "half' })
      expectError(res, 400, 'invalid_json')
      expectClean(res)
    }
    const patch = await ctx.call('PATCH', '/v1/auth/me', { token: alice.token, rawBody: '{walletAddress:1}' })
    expectError(patch, 400, 'invalid_json')
  })

  test('JSON is read whatever the case of its media type, and malformed JSON so sent is still invalid_json', async () => {
    for (const type of ['application/JSON', 'Application/Json; charset=utf-8', 'APPLICATION/JSON']) {
      const name = `case-${Math.random().toString(36).slice(2, 10)}`
      const created = await ctx.call('POST', '/v1/participants', {
        token: alice.token,
        rawBody: JSON.stringify({ name }),
        headers: { 'content-type': type },
      })
      expect(created.status).toBe(201)
      expect(created.body.data.name).toBe(name)
      expectError(
        await ctx.call('POST', '/v1/participants', { token: alice.token, rawBody: '{"name": "half', headers: { 'content-type': type } }),
        400,
        'invalid_json',
      )
    }
  })

  test('a body declared over 1 MiB is 413 payload_too_large on /v1/participants', async () => {
    const body = JSON.stringify({ name: 'x'.repeat(oneMiB) })
    const res = await send('/v1/participants', body, { authorization: `Bearer ${alice.token}` })
    const error = expectError(res, 413, 'payload_too_large')
    expect(error.message).toContain(String(oneMiB))
    expectClean(res)
  })

  test('a body over 1 MiB without a content-length (chunked) is also 413, not invalid_json', async () => {
    const bytes = new TextEncoder().encode(JSON.stringify({ name: 'x'.repeat(oneMiB) }))
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(bytes)
        controller.close()
      },
    })
    const request = new Request('http://test.local/v1/participants', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${alice.token}` },
      body: stream,
    })
    expect(request.headers.get('content-length')).toBeNull()
    const response = await ctx.app.handle(request)
    expectError({ status: response.status, headers: response.headers, body: await response.json() }, 413, 'payload_too_large')
  })

  test('a chunked body whose sender goes away midway is a 400 of the client’s, not a 500', async () => {
    let sent = 0
    const stream = new ReadableStream({
      pull(controller) {
        if (sent++ === 0) controller.enqueue(new TextEncoder().encode('{"name": "half'))
        else controller.error(new Error('The connection was closed.'))
      },
    })
    const request = new Request('http://test.local/v1/participants', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${alice.token}` },
      body: stream,
    })
    const response = await ctx.app.handle(request)
    const error = expectError({ status: response.status, headers: response.headers, body: await response.json() }, 400, 'validation_failed')
    expect(error.message).toContain('could not be read')
  })

  test('a body just under 1 MiB is not refused for its size', async () => {
    const body = JSON.stringify({ name: 'x'.repeat(oneMiB - 64) })
    const res = await send('/v1/participants', body, { authorization: `Bearer ${alice.token}` })
    expectError(res, 400, 'validation_failed')
  })

  test('config listings accept bodies up to 2 MiB: 1.5 MiB on /v1/billing/configs is not 413', async () => {
    const body = JSON.stringify({ content: 'x'.repeat(1.5 * oneMiB) })
    const res = await send('/v1/billing/configs', body, { authorization: `Bearer ${alice.token}` })
    expect(res.status).not.toBe(413)
    const over = await send('/v1/billing/configs', JSON.stringify({ content: 'x'.repeat(2 * oneMiB) }))
    expectError(over, 413, 'payload_too_large')
  })

  test('a validation failure is 400 validation_failed with {path, message} details and no framework dump', async () => {
    const res = await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name: 5, extra: true } })
    const body = expectError(res, 400, 'validation_failed')
    expectClean(res)
    expect(body.details.length).toBeGreaterThan(0)
    for (const detail of body.details) {
      expect(Object.keys(detail).sort()).toEqual(['message', 'path'])
      expect(detail.path).toMatch(/^\//)
      expect(typeof detail.message).toBe('string')
    }
    expect(body.details.map((detail: { path: string }) => detail.path)).toContain('/name')
    expect(body.details.map((detail: { path: string }) => detail.path)).toContain('/extra')
    // Clients that show only the message (the reference loop, the MCP server) still learn what to fix.
    const [first] = body.details
    expect(body.message).toBe(`The request body is not valid: ${first.path} ${first.message} (and ${body.details.length - 1} more)`)
  })

  test('the message keeps a long key name short; details carry it whole', async () => {
    const key = 'k'.repeat(5000)
    const res = await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name: 'long-key-bot', [key]: true } })
    const body = expectError(res, 400, 'validation_failed')
    expect(body.details.map((detail: { path: string }) => detail.path)).toContain(`/${key}`)
    expect(body.message.length).toBeLessThan(400)
    expect(body.message).toStartWith('The request body is not valid: /kkk')
    // Cut between characters: no half of an emoji is left.
    const emoji = await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name: 'long-key-bot', [`x${'😀'.repeat(400)}`]: true } })
    const cut = expectError(emoji, 400, 'validation_failed').message as string
    expect(cut.length).toBeLessThan(700)
    expect(cut.isWellFormed()).toBe(true)
  })

  test('a check made by the route names its problem in the message too', async () => {
    const res = await ctx.call('PATCH', '/v1/auth/me', { token: alice.token, body: { walletAddress: `0x${'aB'.repeat(20)}` } })
    const body = expectError(res, 400, 'validation_failed')
    // A wrong EIP-55 checksum: the route's own check, past the schema.
    expect(body.details).toEqual([{ path: '/walletAddress', message: expect.stringContaining('checksum') }])
    expect(body.message).toBe(`The request is not valid: /walletAddress ${body.details[0].message}`)
  })

  test('a nullable field names the constraint its value broke, not only that no variant fits', async () => {
    const agent = await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name: `nullable-${alice.id.slice(0, 8)}` } })
    const setDescription = (description: unknown) =>
      ctx.call('PATCH', `/v1/participants/${agent.body.data.id}`, { token: alice.token, body: { description } })
    const long = expectError(await setDescription('x'.repeat(2001)), 400, 'validation_failed')
    expect(long.details).toEqual([{ path: '/description', message: expect.stringContaining('2000') }])
    expect(long.message).toBe(`The request body is not valid: /description ${long.details[0].message}`)
    // A wallet address's shape is the schema's (so the OpenAPI document shows it); its checksum, the route's.
    const wallet = await ctx.call('PATCH', '/v1/auth/me', { token: alice.token, body: { walletAddress: '0x1234' } })
    expect(expectError(wallet, 400, 'validation_failed').details).toEqual([{ path: '/walletAddress', message: expect.stringContaining('{40}') }])
    // A value of neither variant's type: the union's own message is all there is to say.
    expect(expectError(await setDescription(42), 400, 'validation_failed').details).toEqual([{ path: '/description', message: expect.any(String) }])
    // Nor is any one of a choice of literals the answer to a string that is none of them.
    const status = await ctx.call('GET', `/blog/manage/${agent.body.data.id}?status=nope`, { apiKey: agent.body.data.apiKey })
    expect(expectError(status, 400, 'validation_failed').details).toEqual([{ path: '/status', message: expect.not.stringContaining("'draft'") }])
  })

  test('a body that may be left out names the field it refused, not only that no variant fits', async () => {
    const unknown = '00000000-0000-4000-8000-000000000000'
    // An optional body (a purchase's, a device decision's) is an object, null or nothing: an object sent
    // is that variant's, whose own problems say where.
    const price = await ctx.call('POST', `/v1/billing/configs/${unknown}/purchase`, { token: alice.token, body: { expectedPriceCents: -1 } })
    expect(expectError(price, 400, 'validation_failed').details).toEqual([{ path: '/expectedPriceCents', message: expect.stringContaining('0') }])
    const action = await ctx.call('PATCH', '/v1/auth/device-codes/BCDF-GHJK', { token: alice.token, body: { action: 'maybe' } })
    expect(expectError(action, 400, 'validation_failed').details).toEqual([{ path: '/action', message: expect.any(String) }])
    const extra = await ctx.call('PATCH', '/v1/auth/device-codes/BCDF-GHJK', { token: alice.token, body: { action: 'deny', note: 'x' } })
    const body = expectError(extra, 400, 'validation_failed')
    expect(body.details).toEqual([{ path: '/note', message: expect.any(String) }])
    expect(body.message).toBe(`The request body is not valid: /note ${body.details[0].message}`)
    // A value of none of its types (an array) keeps the union's word for it.
    expect(
      expectError(await ctx.call('PATCH', '/v1/auth/device-codes/BCDF-GHJK', { token: alice.token, body: [] }), 400, 'validation_failed').details,
    ).toEqual([{ path: '/', message: expect.any(String) }])
  })

  test('invalid path parameters are 400 validation_failed naming the parameter', async () => {
    const res = await ctx.call('DELETE', '/v1/auth/api-keys/not-a-uuid', { token: alice.token })
    const body = expectError(res, 400, 'validation_failed')
    expectClean(res)
    expect(body.details).toEqual([{ path: '/id', message: expect.any(String) }])
  })
})

describe('bodies over the wire', () => {
  // Requests from a real HTTP server carry a content-length or a transfer coding, which the body
  // limit reads instead of asking for the body; in-process requests (the tests above) carry neither.
  let server: ReturnType<typeof Bun.serve>
  beforeAll(() => {
    server = Bun.serve({ hostname: '127.0.0.1', port: 0, maxRequestBodySize: 8 * oneMiB, fetch: request => ctx.app.handle(request) })
  })
  afterAll(() => server.stop(true))
  const post = async (path: string, body: string | ReadableStream, headers: Record<string, string>): Promise<CallResult> => {
    const response = await fetch(`http://127.0.0.1:${server.port}${path}`, {
      method: 'POST',
      body,
      headers: { authorization: `Bearer ${alice.token}`, ...headers },
    })
    return { status: response.status, headers: response.headers, body: await response.json() }
  }
  const chunked = (text: string) => {
    const bytes = new TextEncoder().encode(text)
    return new ReadableStream({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 64 * 1024) controller.enqueue(bytes.slice(i, i + 64 * 1024))
        controller.close()
      },
    })
  }

  test('JSON under any case of its media type is read, with a length or chunked', async () => {
    for (const body of [(text: string) => text, chunked]) {
      const name = `wire-${Math.random().toString(36).slice(2, 10)}`
      const created = await post('/v1/participants', body(JSON.stringify({ name })), { 'content-type': 'Application/JSON' })
      expect(created.status).toBe(201)
      expect(created.body.data.name).toBe(name)
    }
  })

  test('over 1 MiB is 413 whether its length is declared or it comes chunked; 1.5 MiB is fine on config listings', async () => {
    const big = JSON.stringify({ name: 'x'.repeat(oneMiB) })
    expectError(await post('/v1/participants', big, { 'content-type': 'application/json' }), 413, 'payload_too_large')
    expectError(await post('/v1/participants', chunked(big), { 'content-type': 'application/json' }), 413, 'payload_too_large')
    const listing = await post('/v1/billing/configs', JSON.stringify({ content: 'x'.repeat(1.5 * oneMiB) }), { 'content-type': 'application/json' })
    expect(listing.status).not.toBe(413)
  })
})

describe('health', () => {
  test('GET /health is 200 with Postgres and Redis ok', async () => {
    const res = await ctx.call('GET', '/health')
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ status: 'ok', postgres: 'ok', redis: 'ok' })
  })

  test('GET /v1/health is /health in the envelope, where the original CLIs read data.status', async () => {
    const res = await ctx.call('GET', '/v1/health')
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ success: true, data: { status: 'ok', postgres: 'ok', redis: 'ok' } })
    const broken = await createTestContext()
    try {
      broken.deps.redis.disconnect()
      const res = await broken.call('GET', '/v1/health')
      const down = expectError(res, 503, 'unavailable')
      expect(down.details).toEqual([{ path: '/redis', message: 'Redis is unreachable' }])
      // As every 503 does, it says when to try again (the original CLIs retry on it).
      expect(res.headers.get('retry-after')).toBe('1')
    } finally {
      await broken.close()
    }
  })

  test('GET /health/live is 200; GET /health/ready is 200 with Postgres, Redis and the migrations ok', async () => {
    const live = await ctx.call('GET', '/health/live')
    expect(live.status).toBe(200)
    expect(live.body).toEqual({ success: true, data: { status: 'live' } })
    const ready = await ctx.call('GET', '/health/ready')
    expect(ready.status).toBe(200)
    expect(ready.body).toEqual({ success: true, data: { status: 'ready', postgres: 'ok', redis: 'ok', migrations: 'applied' } })
  })

  test('GET /health/ready is 503 unavailable, naming each reason: pending migrations, draining, Redis, Postgres', async () => {
    const broken = await createTestContext()
    const reasons = async () => {
      const res = await broken.call('GET', '/health/ready')
      expectError(res, 503, 'unavailable')
      expect(res.headers.get('retry-after')).toBe('1')
      return res.body.details.map((detail: { path: string }) => detail.path)
    }
    try {
      await broken.deps.sql`delete from migrations where id = (select max(id) from migrations)`
      expect(await reasons()).toEqual(['/migrations'])
      broken.deps.lifecycle.drain()
      expect(await reasons()).toEqual(['/migrations', '/draining'])
      // Live as long as the process answers, draining or not.
      expect((await broken.call('GET', '/health/live')).status).toBe(200)
      broken.deps.redis.disconnect()
      expect(await reasons()).toEqual(['/migrations', '/redis', '/draining'])
      await broken.deps.sql.end()
      expect(await reasons()).toEqual(['/postgres', '/redis', '/draining'])
    } finally {
      await broken.close()
    }
  })

  test("GET /health/ready answers 503 naming Postgres or Redis within a probe's 1 s while either hangs", async () => {
    const database = await createTestDatabase()
    const [postgres, redis] = await Promise.all([startHeldProxy(database.url), startHeldProxy(redisUrl)])
    const through = new URL(database.url)
    through.port = new URL(postgres.url).port
    const held = await createTestContext({ database: { ...database, url: through.href }, env: { REDIS_URL: redis.url } })
    try {
      expect((await held.call('GET', '/health/ready')).status).toBe(200)
      for (const [proxy, reason] of [
        [postgres, '/postgres'],
        [redis, '/redis'],
      ] as const) {
        proxy.hold()
        const started = performance.now()
        const res = await held.call('GET', '/health/ready')
        const ms = performance.now() - started
        proxy.release()
        expectError(res, 503, 'unavailable')
        expect(res.body.details.map((detail: { path: string }) => detail.path)).toEqual([reason])
        // The probe's own limit, not a tighter one: the checks give up at 0.75 s, and a loaded machine
        // may take a while longer to answer.
        expect(ms).toBeLessThan(1000)
      }
    } finally {
      await held.close()
      await Promise.all([postgres.close(), redis.close(), database.drop()])
    }
  })

  test('names Redis, then Postgres, as down with 503; a request needing Postgres is 503 unavailable without SQL', async () => {
    const broken = await createTestContext()
    try {
      broken.deps.redis.disconnect()
      const redisDown = await broken.call('GET', '/health')
      expect(redisDown.status).toBe(503)
      expect(redisDown.body).toEqual({ status: 'unavailable', postgres: 'ok', redis: 'down' })

      await broken.deps.sql.end()
      const bothDown = await broken.call('GET', '/health')
      expect(bothDown.status).toBe(503)
      expect(bothDown.body).toEqual({ status: 'unavailable', postgres: 'down', redis: 'down' })

      const res = await broken.call('GET', '/v1/participants/some-agent')
      expectError(res, 503, 'unavailable')
      expectClean(res)
    } finally {
      await broken.close()
    }
  })
})

describe('logs', () => {
  test('a request failed by an outage is logged by its route template, never its path (a device code is a credential)', async () => {
    const broken = await createTestContext()
    const lines: string[] = []
    const app = createApp({ ...broken.deps, log: createLog('info', line => lines.push(line)) })
    try {
      broken.deps.redis.disconnect()
      const deviceCode = 'dc_logged-nowhere-0123456789abcdef'
      const res = await callApp(app, 'GET', `/v1/auth/device-codes/${deviceCode}`)
      expectError(res, 503, 'unavailable')
      const records = lines.map(line => JSON.parse(line))
      expect(records.map(record => [record.msg, record.route])).toEqual([['backing service unavailable', '/v1/auth/device-codes/:code']])
      expect(lines.join('\n')).not.toContain(deviceCode)
    } finally {
      await broken.close()
    }
  })

  test('a response that fails its own schema is 500, logged by where it failed, never with the response (an API key, a listing)', async () => {
    const lines: string[] = []
    const secret = 'sk_agt_0123456789abcdef0123456789abcdef'
    const log = createLog('info', line => lines.push(line))
    // A bug the types missed: a field of the wrong type.
    const body = () => ({ apiKey: secret, count: 'three' as unknown as number, items: Array.from({ length: 5000 }, (_, i) => `item-${i}`) })
    const response = { 200: t.Object({ apiKey: t.String(), count: t.Number(), items: t.Array(t.String()) }) }
    const app = new Elysia().use(httpErrors(log, routeMethods(), { draining: false }, null)).get('/broken', body, { response })
    const res = await app.handle(new Request('http://test.local/broken'))
    expect([res.status, ((await res.json()) as { error: string }).error]).toEqual([500, 'internal'])
    expect(lines.map(line => JSON.parse(line))).toEqual([
      {
        time: expect.any(String),
        level: 'error',
        msg: 'response failed its own schema',
        route: '/broken',
        requestId: res.headers.get('x-request-id'),
        issues: [{ path: '/count', message: 'Expected number' }],
      },
    ])
    expect(lines[0]).not.toContain(secret)
  })

  test('a 500 gives the reference its log record holds: the X-Request-Id a proxy sent, or a new one when it sent none fit to log', async () => {
    const lines: string[] = []
    const log = createLog('info', line => lines.push(line))
    const app = new Elysia().use(httpErrors(log, routeMethods(), { draining: false }, null)).get('/broken', () => {
      throw new Error('a bug')
    })
    const answer = async (headers: Record<string, string>) => {
      const res = await app.handle(new Request('http://test.local/broken', { headers }))
      const body = (await res.json()) as { error: string; message: string }
      const record = JSON.parse(lines.at(-1)!)
      expect([res.status, body.error, record.msg]).toEqual([500, 'internal', 'unhandled error'])
      expect(record.requestId).toBe(res.headers.get('x-request-id'))
      expect(body.message).toBe(`Something went wrong on our side (request ${record.requestId})`)
      return record.requestId as string
    }
    // nginx's $request_id, and a load balancer's own.
    expect(await answer({ 'x-request-id': '8f3b9c0d2e1a4f5b6c7d8e9f0a1b2c3d' })).toBe('8f3b9c0d2e1a4f5b6c7d8e9f0a1b2c3d')
    expect(await answer({ 'x-request-id': 'Root=1-67891233:abc.def_9' })).toBe('Root=1-67891233:abc.def_9')
    // None, or one not fit for a log line (a quote, a space, too long): a UUID of its own, each time another.
    const made = [
      await answer({}),
      await answer({ 'x-request-id': 'a"b' }),
      await answer({ 'x-request-id': 'a b' }),
      await answer({ 'x-request-id': 'x'.repeat(129) }),
    ]
    for (const id of made) expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(new Set(made).size).toBe(4)
  })

  test('every 500 gives a reference its log record holds: a refusal no error maps, a failure that escapes the app', async () => {
    const lines: string[] = []
    const log = createLog('info', line => lines.push(line))
    const app = new Elysia().use(httpErrors(log, routeMethods(), { draining: false }, null)).get('/refused', () => {
      accepted({ refused: 'unheard_of' })
    })
    const answers = [
      await app.handle(new Request('http://test.local/refused', { headers: { 'x-request-id': 'edge-1' } })),
      serverOptions(log).error(new Error('escaped the app')),
    ]
    const records = lines.map(line => JSON.parse(line))
    expect(records.map(record => [record.level, record.msg])).toEqual([
      ['error', 'unhandled error'],
      ['error', 'unhandled server error'],
    ])
    expect(answers[0]!.headers.get('x-request-id')).toBe('edge-1')
    for (const [i, res] of answers.entries()) {
      const body = (await res.json()) as { error: string; message: string }
      expect([res.status, body.error]).toEqual([500, 'internal'])
      expect(records[i].requestId).toBeString()
      expect(res.headers.get('x-request-id')).toBe(records[i].requestId)
      expect(body.message).toBe(`Something went wrong on our side (request ${records[i].requestId})`)
    }
  })
})

describe('OpenAPI document', () => {
  // The document is checked field by field below, with its references resolved.
  let doc: any

  beforeAll(async () => {
    const res = await ctx.call('GET', '/swagger/json')
    expect(res.status).toBe(200)
    doc = await SwaggerParser.dereference(structuredClone(res.body))
  })

  const operations = () =>
    Object.entries<Record<string, any>>(doc.paths).flatMap(([path, item]) =>
      Object.entries<any>(item)
        .filter(([method]) => ['get', 'put', 'post', 'patch', 'delete', 'head', 'options'].includes(method))
        .map(([method, operation]) => ({ path, method, operation })),
    )

  test('is a valid OpenAPI 3 document', async () => {
    expect(doc.openapi).toMatch(/^3\./)
    await SwaggerParser.validate((await ctx.call('GET', '/swagger/json')).body)
  })

  test('every operation has a unique operationId, tags and a schema for every declared status', () => {
    const ids = new Set<string>()
    for (const { path, method, operation } of operations()) {
      const where = `${method.toUpperCase()} ${path}`
      expect(typeof operation.operationId, where).toBe('string')
      expect(ids.has(operation.operationId), `${where}: duplicate ${operation.operationId}`).toBe(false)
      ids.add(operation.operationId)
      expect(operation.tags?.length, where).toBeGreaterThan(0)
      const statuses = Object.keys(operation.responses ?? {})
      expect(statuses.length, where).toBeGreaterThan(0)
      // JSON everywhere, but the public blog pages are HTML (their 404 too) and its feeds RSS; what the
      // HTTP layer refuses before a page is made (a URL too long, say) is the JSON envelope.
      const page = path.startsWith('/@') || path === '/device'
      for (const status of statuses) {
        const content = operation.responses[status].content ?? {}
        const types = Object.keys(content)
        // A 304 (a public document asked with its ETag) has no body.
        expect(types, `${where} ${status}`).toHaveLength(status === '304' ? 0 : 1)
        if (status === '304') continue
        const allowed =
          page && (Number(status) < 400 || status === '404')
            ? ['text/html']
            : path.startsWith('/v1/events/') && status === '200'
              ? ['text/event-stream']
              : ['application/json', 'application/rss+xml']
        expect(allowed).toContain(types[0]!)
        expect(content[types[0]!].schema, `${where} ${status}`).toBeObject()
      }
      // /health answers 503 with its own report (what is down), and an HTML page its 404 as a page.
      const ownFailure = (status: string) => (path === '/health' && status === '503') || (page && status === '404')
      for (const status of statuses.filter(status => Number(status) >= 400 && !ownFailure(status))) {
        const schema = operation.responses[status].content['application/json'].schema
        expect(schema.required, `${where} ${status}`).toEqual(expect.arrayContaining(['success', 'statusCode', 'error', 'message']))
      }
    }
    expect(ids.size).toBeGreaterThanOrEqual(16)
  })

  test('documents a JSON schema for every request body', () => {
    const withBodies = operations().filter(({ operation }) => operation.requestBody)
    expect(withBodies.length).toBeGreaterThan(0)
    for (const { operation } of withBodies) {
      expect(operation.requestBody.content['application/json']?.schema).toBeObject()
    }
  })

  test('declares the bearer and X-API-Key security schemes', () => {
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' })
    expect(doc.components.securitySchemes.apiKey).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-API-Key' })
    for (const { operation } of operations()) {
      for (const requirement of operation.security ?? []) {
        for (const scheme of Object.keys(requirement)) expect(doc.components.securitySchemes).toHaveProperty(scheme)
      }
    }
  })

  test('lists every route the service has today', () => {
    const expected: Record<string, string[]> = {
      '/health': ['get'],
      '/health/live': ['get'],
      '/health/ready': ['get'],
      '/v1/auth/me': ['get', 'patch'],
      '/v1/auth/api-keys': ['get', 'post'],
      '/v1/auth/api-keys/{id}': ['delete'],
      '/v1/auth/device-codes': ['post'],
      '/v1/auth/device-codes/{code}': ['get', 'patch'],
      '/v1/auth/sse-token': ['post'],
      '/v1/participants': ['get', 'post'],
      '/v1/participants/{id}': ['get', 'patch', 'delete'],
      '/v1/participants/{id}/api-key': ['post'],
      '/v1/billing/plans/{id}': ['get', 'patch', 'delete'],
      '/v1/billing/configs/{id}': ['get', 'patch', 'delete'],
      '/v1/billing/configs/{id}/purchase': ['post'],
      '/blog/posts': ['post'],
      '/blog/posts/{postId}': ['get', 'patch', 'delete'],
      '/blog/manage/{agentId}': ['get'],
      '/blog/posts/{postId}/reactions': ['get', 'post', 'delete'],
      '/blog/feed': ['get'],
      '/blog/feed.xml': ['get'],
      '/blog/{agentIdOrName}/posts': ['get'],
      '/blog/{agentIdOrName}/posts/{slug}': ['get'],
      '/blog/{agentIdOrName}/rss': ['get'],
      '/@{name}/blog': ['get'],
      '/@{name}/blog/{slug}': ['get'],
    }
    for (const [path, methods] of Object.entries(expected)) {
      for (const method of methods) expect(doc.paths[path]?.[method], `${method.toUpperCase()} ${path}`).toBeObject()
    }
  })

  test('documents every route the app registers, except the documentation itself', () => {
    const routes = ctx.app.routes.filter(route => !route.path.startsWith('/swagger'))
    expect(routes.length).toBeGreaterThanOrEqual(16)
    for (const route of routes) {
      const path = route.path.replace(/:([A-Za-z0-9_]+)/g, '{$1}')
      expect(doc.paths[path]?.[route.method.toLowerCase()], `${route.method} ${route.path}`).toBeObject()
    }
    expect(doc.paths).not.toHaveProperty('/swagger')
    expect(doc.paths).not.toHaveProperty('/swagger/json')
  })

  test('GET /swagger serves the HTML reference, its script and styles from the service itself', async () => {
    const response = await ctx.app.handle(new Request('http://test.local/swagger'))
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toContain('text/html')
    const html = await response.text()
    expect(html).toStartWith('<!doctype html>')
    const sources = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map(match => match[1]!)
    expect(sources.sort()).toEqual([
      '/swagger/assets/favicon-32x32.png',
      '/swagger/assets/init.js',
      '/swagger/assets/swagger-ui-bundle.js',
      '/swagger/assets/swagger-ui.css',
    ])
    for (const source of sources) {
      const asset = await ctx.app.handle(new Request(`http://test.local${source}`))
      expect(asset.status, source).toBe(200)
      expect((await asset.arrayBuffer()).byteLength, source).toBeGreaterThan(0)
    }
    expect(await (await ctx.app.handle(new Request('http://test.local/swagger/assets/init.js'))).text()).toContain("url: '/swagger/json'")
    expectError(await ctx.call('GET', '/swagger/assets/package.json'), 404, 'not_found')
  })
})

describe('values Postgres cannot store', () => {
  test('a NUL character in a text field is 400, not 500, and nothing is written', async () => {
    const ctx = await createTestContext()
    try {
      const user = await signUp(ctx)
      const agent = await ctx.call('POST', '/v1/participants', { token: user.token, body: { name: 'nul-test', displayName: 'a\u0000b' } })
      expectError(agent, 400, 'validation_failed')
      const [row] = await ctx.deps.sql`select count(*)::int as n from participants where name = 'nul-test'`
      expect(row!.n).toBe(0)
    } finally {
      await ctx.close()
    }
  })
})
