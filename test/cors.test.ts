/**
 * CORS headers, checked on the app's answers (the browser's side of them: cross-origin.test.ts):
 * none by default, exact origins from CORS_ORIGINS, preflights answered before any credential, and
 * every answer a page may get (errors, streams) readable with the headers the API sends.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { errors, type AppError } from '../src/errors.ts'
import { allowedRequestHeaders, exposedResponseHeaders } from '../src/http/cors.ts'
import { createTestContext, expectError, signUp, type TestContext, type TestUser } from './helpers/context.ts'

const dashboard = 'https://app.example.com'
const alsoListed = 'http://localhost:5173'

let listed: TestContext
let unset: TestContext
let any: TestContext
let user: TestUser

beforeAll(async () => {
  listed = await createTestContext({
    relay: false,
    env: {
      CORS_ORIGINS: `${dashboard},${alsoListed}`,
      RATE_LIMITS: JSON.stringify({ sseTokenCreate: { capacity: 1, perSeconds: 3600 } }),
      // Metrics served: requests are timed, and the door's hook is the one that tells them (the other is `unset`'s).
      METRICS_TOKEN: 'a-metrics-token-of-at-least-32-characters',
    },
  })
  unset = await createTestContext({ database: listed.database, relay: false })
  any = await createTestContext({ database: listed.database, relay: false, env: { CORS_ORIGINS: '*' } })
  user = await signUp(listed)
})
afterAll(async () => {
  await any?.close()
  await unset?.close()
  await listed?.close()
})

/** A browser's preflight for `method` on `path` from a page on `origin`, with the headers it would send. */
const preflight = (ctx: TestContext, path: string, origin: string, method: string, headers = 'authorization,content-type') =>
  ctx.call('OPTIONS', path, { headers: { origin, 'access-control-request-method': method, 'access-control-request-headers': headers } })

const corsHeaders = (headers: Headers) => Object.fromEntries([...headers].filter(([name]) => name.startsWith('access-control-')))

describe('CORS_ORIGINS unset (the default)', () => {
  test('no answer carries a CORS header or Vary: a preflight gets the plain OPTIONS answer, and the browser sends nothing', async () => {
    const answer = await preflight(unset, '/v1/auth/me', dashboard, 'GET')
    expect(answer.status).toBe(204)
    expect(answer.headers.get('allow')).toBe('GET, HEAD, OPTIONS, PATCH')
    expect(corsHeaders(answer.headers)).toEqual({})
    for (const response of [
      await unset.call('GET', '/v1/auth/me', { token: user.token, headers: { origin: dashboard } }),
      await unset.call('GET', '/v1/auth/me', { headers: { origin: dashboard } }),
    ]) {
      expect(corsHeaders(response.headers)).toEqual({})
      expect(response.headers.get('vary')).toBeNull()
    }
  })
})

describe('CORS_ORIGINS listing the dashboard', () => {
  test('a preflight from a listed origin is answered before any credential: the path’s methods, the headers the API reads, for 2 hours', async () => {
    const answer = await preflight(listed, '/v1/context/tone/voice/revert', dashboard, 'POST', 'authorization,content-type,idempotency-key')
    expect(answer.status).toBe(204)
    expect(answer.body).toBe('')
    expect(answer.headers.get('allow')).toBe('OPTIONS, POST')
    expect(answer.headers.get('vary')).toBe('Origin')
    expect(corsHeaders(answer.headers)).toEqual({
      'access-control-allow-origin': dashboard,
      'access-control-allow-methods': 'OPTIONS, POST',
      'access-control-allow-headers': 'authorization, content-type, idempotency-key, last-event-id, x-api-key',
      'access-control-expose-headers': 'accept-encoding, allow, retry-after, www-authenticate, x-request-id',
      'access-control-max-age': '7200',
    })
    expect(answer.headers.get('access-control-allow-credentials')).toBeNull()
    expect(corsHeaders((await preflight(listed, '/v1/agent/events', alsoListed, 'GET', 'x-api-key')).headers)).toMatchObject({
      'access-control-allow-origin': alsoListed,
      'access-control-allow-methods': 'GET, HEAD, OPTIONS',
    })
  })

  test.each([
    ['another origin', 'https://evil.example.com'],
    ['the listed host on another scheme', 'http://app.example.com'],
    ['the listed host on another port', 'https://app.example.com:8443'],
    ['a subdomain of the listed host', 'https://eu.app.example.com'],
    ['a sandboxed frame or a file (null)', 'null'],
  ])('a preflight from %s gets no CORS header (Vary: Origin still), and the browser sends nothing', async (_, origin) => {
    const answer = await preflight(listed, '/v1/auth/me', origin, 'GET')
    expect(answer.status).toBe(204)
    expect(answer.headers.get('vary')).toBe('Origin')
    expect(corsHeaders(answer.headers)).toEqual({})
  })

  test('a preflight for a method the path does not take, or a header the API does not read, is answered without them', async () => {
    const method = await preflight(listed, '/v1/auth/me', dashboard, 'DELETE')
    expect(method.headers.get('access-control-allow-methods')).toBe('GET, HEAD, OPTIONS, PATCH')
    const header = await preflight(listed, '/v1/auth/me', dashboard, 'GET', 'authorization,x-debug-user')
    expect(header.headers.get('access-control-allow-headers')!.split(', ')).toEqual(allowedRequestHeaders)
    // On a path the service does not have, a 404: a preflight must be answered 2xx, so the browser stops there.
    const unknown = await preflight(listed, '/v1/no-such-thing', dashboard, 'GET')
    expectError(unknown, 404, 'not_found')
    expect(unknown.headers.get('access-control-allow-methods')).toBeNull()
  })

  test('every answer to a listed page is readable, errors and streams included, with the headers the API sends', async () => {
    const asPage = { origin: dashboard }
    const answers = {
      ok: await listed.call('GET', '/v1/auth/me', { token: user.token, headers: asPage }),
      unauthorized: await listed.call('GET', '/v1/auth/me', { token: `${user.token}x`, headers: asPage }),
      notFound: await listed.call('GET', '/v1/no-such-thing', { headers: asPage }),
      wrongMethod: await listed.call('DELETE', '/v1/auth/me', { token: user.token, headers: asPage }),
      tooLarge: await listed.call('PUT', '/v1/context/tone/voice', { token: user.token, headers: asPage, rawBody: 'x'.repeat(1024 * 1024 + 1) }),
      token: await listed.call('POST', '/v1/auth/sse-token', { token: user.token, headers: asPage }),
      limited: await listed.call('POST', '/v1/auth/sse-token', { token: user.token, headers: asPage }),
    }
    expect(Object.fromEntries(Object.entries(answers).map(([name, answer]) => [name, answer.status]))).toEqual({
      ok: 200,
      unauthorized: 401,
      notFound: 404,
      wrongMethod: 405,
      tooLarge: 413,
      token: 200,
      limited: 429,
    })
    expect(answers.limited.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/)
    const stream = await listed.app.handle(new Request('http://test.local/v1/events/chat', { headers: asPage }))
    expect(stream.headers.get('content-type')).toStartWith('text/event-stream')
    await stream.body?.cancel()
    for (const headers of [...Object.values(answers).map(answer => answer.headers), stream.headers]) {
      expect(headers.get('vary')).toBe('Origin')
      expect(corsHeaders(headers)).toEqual({
        'access-control-allow-origin': dashboard,
        'access-control-expose-headers': exposedResponseHeaders.join(', '),
      })
    }
    // To a page elsewhere, the same answers say only that they depend on the origin.
    const elsewhere = await listed.call('GET', '/v1/auth/me', { token: user.token, headers: { origin: 'https://evil.example.com' } })
    expect(elsewhere.status).toBe(200)
    expect(elsewhere.headers.get('vary')).toBe('Origin')
    expect(corsHeaders(elsewhere.headers)).toEqual({})
    // As does one with no Origin (curl, a server, a same-origin GET), which a cache may keep for pages too.
    const direct = await listed.call('GET', '/v1/auth/me', { token: user.token })
    expect(direct.headers.get('vary')).toBe('Origin')
    expect(corsHeaders(direct.headers)).toEqual({})
  })

  test('every header an error of the catalogue sends is one a page may read', () => {
    // Read by any page (CORS-safelisted), or for the connection, not the page.
    const unexposed = new Set([
      'cache-control',
      'content-language',
      'content-length',
      'content-type',
      'expires',
      'last-modified',
      'pragma',
      'connection',
    ])
    const sent = new Set<string>(['allow'])
    for (const make of Object.values(errors)) {
      const error = (make as (...args: unknown[]) => AppError)(1, ['GET'])
      for (const name of Object.keys(error.headers ?? {})) sent.add(name)
    }
    expect(sent).toContain('retry-after')
    expect([...sent].filter(name => !unexposed.has(name) && !exposedResponseHeaders.includes(name))).toEqual([])
  })
})

describe('CORS_ORIGINS=*', () => {
  test('every page may call with a credential it holds: `*`, no Vary, never credentials (the API reads no cookie)', async () => {
    const answer = await preflight(any, '/v1/auth/me', 'https://anywhere.example', 'PATCH')
    expect(corsHeaders(answer.headers)).toMatchObject({
      'access-control-allow-origin': '*',
      'access-control-allow-methods': 'GET, HEAD, OPTIONS, PATCH',
      'access-control-max-age': '7200',
    })
    const me = await any.call('GET', '/v1/auth/me', { token: user.token, headers: { origin: 'https://anywhere.example' } })
    expect(me.status).toBe(200)
    expect(me.headers.get('access-control-allow-origin')).toBe('*')
    expect(me.headers.get('access-control-allow-credentials')).toBeNull()
    expect(me.headers.get('vary')).toBeNull()
    // Nothing to say to a request without an Origin.
    expect(corsHeaders((await any.call('GET', '/v1/auth/me', { token: user.token })).headers)).toEqual({})
  })
})
