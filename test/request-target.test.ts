/** What a URL's path and query can carry: each route reads them as sent, or the request is 400 at the door and changes nothing. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { connect } from 'node:net'
import { createAgent, createTestContext, signUp, type CallResult, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { serverOptions } from '../src/http/server-options.ts'

let ctx: TestContext
let alice: TestUser
let agent: TestAgent
let origin: string

beforeAll(async () => {
  ctx = await createTestContext()
  alice = await signUp(ctx, 'alice')
  agent = await createAgent(ctx, alice)
  ctx.app.listen({ hostname: '127.0.0.1', port: 0, ...serverOptions(ctx.deps.log) })
  origin = `http://127.0.0.1:${ctx.app.server!.port}`
})
afterAll(async () => {
  await ctx.app.stop(true)
  await ctx.close()
})

/** The same request in process and over the wire: Bun's router decodes path parameters its own way. */
async function both(method: string, target: string, headers: Record<string, string> = {}, body?: unknown): Promise<CallResult[]> {
  const init = { method, headers: { ...headers, ...(body === undefined ? {} : { 'content-type': 'application/json' }) } }
  const inProcess = await ctx.call(method, target, { headers, body })
  const response = await fetch(`${origin}${target}`, { ...init, body: body === undefined ? undefined : JSON.stringify(body) })
  const text = await response.text()
  return [inProcess, { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null }]
}

function expectRefused(results: CallResult[], where: string, detailPath: string, message: RegExp) {
  for (const [i, result] of results.entries()) {
    const label = `${where} (${i === 0 ? 'in process' : 'over the wire'})`
    expect(result.status, label).toBe(400)
    expect(result.body, label).toMatchObject({ success: false, statusCode: 400, error: 'validation_failed' })
    expect(result.body.message, label).toStartWith('The URL is not valid: ')
    expect(result.body.details?.[0]?.path, label).toBe(detailPath)
    expect(result.body.details?.[0]?.message, label).toMatch(message)
  }
}

const bearer = () => ({ authorization: `Bearer ${alice.token}` })
/** Escapes that decode to no UTF-8 text, and a NUL, which Postgres cannot store. */
const undecodable = ['%', '%E', '%ZZ', 'a%zzb', '%E0%A4%A', '%C0%AF', '%FF', '%ED%A0%80', '%00', 'a%00b']

describe('a path that is not percent-encoded UTF-8 text', () => {
  test('is 400 on every route, naming the parameter, rather than read as U+FFFD, null or the escape itself', async () => {
    for (const bad of undecodable) {
      const named: [string, string][] = [
        [`/v1/participants/${bad}`, '/id'],
        [`/v1/participants/${agent.name}${bad}`, '/id'],
        [`/blog/${bad}/posts`, '/agentIdOrName'],
        [`/@${bad}/blog`, '/name'],
        [`/@${agent.name}/blog/${bad}`, '/slug'],
      ]
      for (const [path, param] of named) expectRefused(await both('GET', path), path, param, /^must be percent-encoded UTF-8 text/)
      expectRefused(await both('GET', `/v1/context/brand/${bad}/versions`, bearer()), bad, '/key', /^must be percent-encoded/)
      // No route has a parameter there: the path as a whole.
      expectRefused(await both('GET', `/v1/nope/${bad}`), bad, '/', /^its path must be percent-encoded UTF-8 text/)
      expectRefused(await both('GET', `/v1/auth/me${bad}`, bearer()), bad, '/', /^its path/)
    }
  })

  test('changes nothing: no context version is written, no device-code miss is counted', async () => {
    for (const bad of undecodable) {
      for (const result of await both('PUT', `/v1/context/custom/key${bad}`, bearer(), { data: { a: 1 } })) expect(result.status, bad).toBe(400)
      // Over the wire each was a miss (10 an hour per user, then 429), looked up as a code with U+FFFD in it.
      for (const result of await both('PATCH', `/v1/auth/device-codes/BCDF-GHJ${bad}`, bearer(), { action: 'deny' }))
        expect(result.status, bad).toBe(400)
    }
    expect(await ctx.deps.sql`select 1 from context_entries where type = 'custom'`).toHaveLength(0)
    const device = (await ctx.call('POST', '/v1/auth/device-codes')).body.data
    const decided = await ctx.call('PATCH', `/v1/auth/device-codes/${device.userCode}`, { token: alice.token, body: { action: 'deny' } })
    expect(decided.status).toBe(200)
  })

  test('valid escapes are read as sent: an encoded slash, percent sign, space or letter is a value like any other', async () => {
    for (const path of ['/v1/participants/a%2Fb', '/v1/participants/100%25', '/v1/participants/a%20b', '/v1/participants/%C3%A9t%C3%A9']) {
      for (const result of await both('GET', path)) expect(result.status, path).toBe(404)
    }
    for (const result of await both('GET', `/v1/participants/${agent.name.replace('a', '%61')}`)) expect(result.body.data?.id).toBe(agent.id)
  })

  test('a raw # is 400: no client sends a fragment, and the routes would read it as part of the value', async () => {
    const answer = await new Promise<string>(resolve => {
      const socket = connect(Number(new URL(origin).port), '127.0.0.1')
      let text = ''
      socket.on('data', chunk => (text += chunk))
      socket.on('close', () => resolve(text))
      socket.write(`GET /v1/participants/${agent.name}#x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`)
    })
    expect(answer).toStartWith('HTTP/1.1 400')
    expect(answer).toContain('"details":[{"path":"/","message":"it must not hold a raw #')
    expectRefused([await ctx.call('GET', '/blog/feed?tag=t#x')], 'in process', '/', /raw #/)
  })
})

describe('a query that is not percent-encoded UTF-8 text', () => {
  test('is 400 naming the parameter, on every route, rather than read as the escape itself', async () => {
    for (const bad of undecodable) {
      expectRefused(await both('GET', `/blog/feed?tag=${bad}`), `tag=${bad}`, '/tag', /^must be percent-encoded UTF-8 text/)
      expectRefused(await both('GET', `/device?user_code=BCDF-GHJ${bad}`), `user_code=${bad}`, '/user_code', /^must be percent-encoded/)
    }
  })

  test('is let through where the route does not read the parameter: unknown ones are ignored, as in a shared link', async () => {
    for (const bad of undecodable) {
      for (const result of await both('GET', `/v1/auth/me?utm_source=${bad}&x=1`, bearer())) expect(result.status, bad).toBe(200)
      // A page, not the JSON 400.
      const page = await fetch(`${origin}/@${agent.name}/blog?utm_term=${bad}`)
      expect(page.headers.get('content-type'), bad).toStartWith('text/html')
      for (const result of await both('GET', `/health?${bad}=1`)) expect(result.status, bad).toBe(200)
    }
  })

  test('valid escapes, + for a space and %2B for a plus are read as sent', async () => {
    for (const since of ['2026-01-01T00%3A00%3A00%2B00%3A00', '2026-01-01+00:00:00Z', '2026-01-01%2000%3A00%3A00Z']) {
      for (const result of await both('GET', `/v1/agent/events?since=${since}`, { 'x-api-key': agent.apiKey })) expect(result.status, since).toBe(200)
    }
    for (const tag of ['%25', 'a+b', '%E2%82%AC', '%2B']) {
      for (const result of await both('GET', `/blog/feed?tag=${tag}`)) expect(result.status, tag).toBe(200)
    }
  })
})

describe('a query parameter given twice', () => {
  test('is 400 naming it when the route reads it, however it is spelled, rather than the last one counting', async () => {
    for (const query of ['limit=1&limit=2', 'limit=2&before=2030-01-01T00:00:00Z&limit=2', 'li%6Dit=1&limit=2']) {
      expectRefused(await both('GET', `/v1/billing/invoices?${query}`, bearer()), query, '/limit', /^must be given once$/)
    }
    expectRefused(await both('GET', '/blog/feed?tag=a&tag=b'), 'tag', '/tag', /^must be given once$/)
    expectRefused(await both('GET', `/@${agent.name}/blog?page=1&page=2`), 'page', '/page', /^must be given once$/)
    const head = await fetch(`${origin}/v1/context?type=brand&type=tone`, { method: 'HEAD', headers: bearer() })
    expect(head.status).toBe(400)
  })

  test('is let through where the route does not read it: unknown parameters are ignored, repeated or not', async () => {
    for (const result of await both('GET', '/blog/feed?utm_source=a&utm_source=b&limit=5')) expect(result.status).toBe(200)
    for (const result of await both('GET', '/v1/auth/me?x=1&x=2', bearer())) expect(result.status).toBe(200)
  })
})

describe('letters that only resemble ASCII', () => {
  test('name no agent and no device code: a Kelvin sign is no k, a long s no s, though Unicode case-folds them so', async () => {
    const kilo = await createAgent(ctx, alice, 'kilo-sierra')
    for (const result of await both('GET', '/v1/participants/KILO-SIERRA')) expect(result.body.data?.id).toBe(kilo.id)
    for (const lookalike of ['\u212Ailo-sierra', 'kilo-\u017Fierra']) {
      for (const result of await both('GET', `/v1/participants/${encodeURIComponent(lookalike)}`)) expect(result.status, lookalike).toBe(404)
    }
    // A code with an S in it, written with ſ (U+017F), whose upper case is S.
    let device: { userCode: string }
    do device = (await ctx.call('POST', '/v1/auth/device-codes')).body.data
    while (!device.userCode.includes('S'))
    const lookalike = encodeURIComponent(device.userCode.toLowerCase().replace(/s/g, '\u017F'))
    expect((await ctx.call('PATCH', `/v1/auth/device-codes/${lookalike}`, { token: alice.token, body: { action: 'deny' } })).status).toBe(404)
    expect(
      (await ctx.call('PATCH', `/v1/auth/device-codes/${device.userCode.toLowerCase()}`, { token: alice.token, body: { action: 'deny' } })).status,
    ).toBe(200)
  })
})
