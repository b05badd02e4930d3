import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes, randomUUID } from 'node:crypto'
import { createServer, type AddressInfo } from 'node:net'
import { forInvoiceRun } from '../src/deps.ts'
import { createTestContext, expectError, signUp, uuidV7, type TestContext, type TestUser } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { startWorker } from './helpers/workers.ts'
import { until } from './helpers/until.ts'
import { holdOpen } from './helpers/held-transaction.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { meteringProcessor } from '../workers/metering.ts'
import { runInvoices } from '../src/invoices/run.ts'
import { duePeriods, issueDueInvoices } from '../src/invoices/store.ts'
import { countRecorded, recordUsage } from '../src/metering/count.ts'
import { meterCall } from '../src/metering/meter.ts'
import { invoiceProcessor } from '../workers/invoices.ts'
import { runMaintenance } from '../workers/maintenance.ts'
import type { Job } from 'bullmq'
import { addMonths } from '../src/billing/periods.ts'
import { ensurePeriods } from '../src/billing/subscriptions/store.ts'
import { agentStats } from '../src/billing/stats/store.ts'
import { deactivateAgent } from '../src/participants/deactivate.ts'
import { counted, meteredSubscriber, type MeteredSubscriber } from './helpers/usage.ts'

let ctx: TestContext
let upstream: Upstream
let worker: { stop(): Promise<void> }
let owner: TestUser
const connectionsKey = randomBytes(32).toString('hex')

beforeAll(async () => {
  ctx = await createTestContext({ env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: connectionsKey } })
  upstream = startUpstream()
  worker = await startWorker(ctx.deps, 'metering', meteringProcessor(ctx.deps))
  owner = await signUp(ctx)
})
afterAll(async () => {
  await worker.stop()
  upstream.stop()
  await ctx.close()
})

type Setup = MeteredSubscriber

const int = async (rows: Promise<{ n: number }[]>) => (await rows)[0]!.n

const setup = (terms: Record<string, number> = {}, provider = 'acme') => meteredSubscriber(ctx, owner, upstream.url, terms, provider)

const proxy = (s: Setup, body: Record<string, unknown> = {}, headers?: Record<string, string>) =>
  ctx.call('POST', '/v1/agent/proxy-call', {
    apiKey: s.agent.apiKey,
    body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo', ...body },
    headers,
  })

describe('connected accounts', () => {
  test('are created with the credential sealed, listed without it, and deleted by their owner only', async () => {
    const user = await signUp(ctx)
    const created = await ctx.call('POST', '/v1/connections', {
      token: user.token,
      body: { provider: 'github', baseUrl: `${upstream.url}/`, credential: 'ghp_supersecret', label: 'Work' },
    })
    expect(created.status).toBe(201)
    expect(created.body.data).toEqual({
      id: created.body.data.id,
      provider: 'github',
      baseUrl: upstream.url,
      label: 'Work',
      createdAt: created.body.data.createdAt,
    })
    const [stored] = await ctx.deps.sql`select credential::text as sealed, credential from connections where id = ${created.body.data.id}`
    expect(Buffer.from(stored!.credential).includes(Buffer.from('ghp_supersecret'))).toBe(false)
    expect(JSON.stringify(stored)).not.toContain('supersecret')
    const list = await ctx.call('GET', '/v1/connections', { token: user.token })
    expect(list.body.data).toEqual([created.body.data])
    expectError(
      await ctx.call('POST', '/v1/connections', { token: user.token, body: { provider: 'github', baseUrl: upstream.url, credential: 'x' } }),
      409,
      'name_taken',
    )
    const stranger = await signUp(ctx)
    expectError(await ctx.call('DELETE', `/v1/connections/${created.body.data.id}`, { token: stranger.token }), 404, 'not_found')
    expect((await ctx.call('DELETE', `/v1/connections/${created.body.data.id}`, { token: user.token })).body.data).toEqual({
      id: created.body.data.id,
      deleted: true,
    })
    expect((await ctx.call('GET', '/v1/connections', { token: user.token })).body.data).toEqual([])
  })

  test('refuse http, private and loopback addresses unless the host is allow-listed', async () => {
    const strict = await createTestContext({ database: ctx.database, env: { REDIS_PREFIX: ctx.config.redisPrefix, CONNECTIONS_KEY: connectionsKey } })
    try {
      const user = await signUp(strict)
      for (const baseUrl of [
        upstream.url,
        'https://127.0.0.1/api',
        'https://localhost/api',
        'https://10.1.2.3',
        'https://192.168.0.10',
        'https://169.254.169.254/latest',
        'https://[::1]/',
        'https://user:pass@example.com',
        'ftp://example.com',
        'not a url',
      ]) {
        const res = await strict.call('POST', '/v1/connections', { token: user.token, body: { provider: 'p', baseUrl, credential: 'x' } })
        const body = expectError(res, 400, 'validation_failed')
        expect(body.details[0].path).toBe('/baseUrl')
      }
      const [row] = await strict.deps.sql`select count(*)::int as n from connections where user_id = ${user.id}`
      expect(row!.n).toBe(0)
    } finally {
      await strict.close()
    }
  })
})

describe('proxy calls', () => {
  test('forward with the stored credential and allowed headers, report the upstream status, and meter', async () => {
    const s = await setup()
    const res = await proxy(s, {
      method: 'POST',
      path: '/echo',
      query: { q: 'x y', n: 2 },
      headers: { 'X-Trace': 'abc', accept: 'application/json' },
      body: { hello: 'world' },
    })
    expect(res.status).toBe(200)
    expect(res.body.data.status).toBe(200)
    expect(res.body.data.headers['content-type']).toContain('application/json')
    const echoed = res.body.data.body
    expect(echoed.method).toBe('POST')
    expect(echoed.path).toBe('/api/echo')
    expect(echoed.query).toBe('?q=x+y&n=2')
    expect(echoed.headers.authorization).toBe('Bearer upstream-secret-token')
    expect(echoed.headers['x-trace']).toBe('abc')
    expect(echoed.headers['content-type']).toBe('application/json')
    expect(JSON.parse(echoed.body)).toEqual({ hello: 'world' })
    expect(res.body.data.usage).toEqual({ periodCalls: 1, includedProxyCalls: 3, overageCalls: 0 })
    const teapot = await proxy(s, { path: '/status/418' })
    expect(teapot.status).toBe(200)
    expect(teapot.body.data).toMatchObject({ status: 418, body: 'status page' })
    const redirect = await proxy(s, { path: '/redirect' })
    expect(redirect.body.data.status).toBe(302)
    expect(await counted(ctx, s.subscriptionId, 3)).toBe(3)
  })

  test('send the query a connection’s base URL holds (an API version, say), before the call’s own', async () => {
    const s = await setup()
    const created = await ctx.call('POST', '/v1/connections', {
      token: s.user.token,
      body: { provider: 'versioned', baseUrl: `${upstream.url}/api?api-version=2024-01-01`, credential: 'versioned-token' },
    })
    expect(created.body.data.baseUrl).toBe(`${upstream.url}/api?api-version=2024-01-01`)
    const bare = await proxy(s, { provider: 'versioned', path: '/echo' })
    expect(bare.body.data.body).toMatchObject({ path: '/api/echo', query: '?api-version=2024-01-01' })
    const queried = await proxy(s, { provider: 'versioned', path: '/echo', query: { q: 'x' } })
    expect(queried.body.data.body).toMatchObject({ path: '/api/echo', query: '?api-version=2024-01-01&q=x' })
  })

  test('refuse other headers, escaping paths, no subscription (403) and no connection (404)', async () => {
    const s = await setup()
    const calls = upstream.received.length
    for (const headers of [{ authorization: 'Bearer mine' }, { host: 'evil' }, { cookie: 'a=b' }]) {
      expectError(await proxy(s, { headers }), 400, 'validation_failed')
    }
    for (const path of ['/../admin', '/%2e%2e/admin', 'echo']) {
      expectError(await proxy(s, { path }), 400, 'validation_failed')
    }
    expectError(await proxy(s, { provider: 'other' }), 404, 'connection_not_found')
    const stranger = await signUp(ctx)
    expectError(await proxy(s, { userId: stranger.id }), 403, 'not_subscribed')
    expectError(
      await ctx.call('POST', '/v1/agent/proxy-call', {
        token: s.user.token,
        body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
      }),
      403,
      'forbidden',
    )
    expect(upstream.received.length).toBe(calls)
    expect(await counted(ctx, s.subscriptionId, 0)).toBe(0)
  })

  test('encoded slashes, backslashes and dot segments in any spelling are 400 before the upstream is called', async () => {
    const s = await setup()
    const calls = upstream.received.length
    for (const path of [
      '/..%2fadmin',
      '/..%2Fadmin',
      '/%2e%2e%2fadmin',
      '/echo%2f..%2f..%2fadmin',
      '/x%5c..%5cadmin',
      '/x%5C..',
      '/a\\..\\admin',
      '/./echo',
      '/echo/.',
      '/a/../echo',
      '/%2e/echo',
      '/.%2e/admin',
      '/%2E%2e/admin',
      '/..;/admin',
      '/%2e%2e;x=1/admin',
      '/%252e%252e/admin',
      '/%252fadmin',
      '/%25252fadmin',
    ]) {
      const refused = expectError(await proxy(s, { path }), 400, 'validation_failed')
      expect({ path, at: refused.details[0].path }).toEqual({ path, at: '/path' })
    }
    expect(upstream.received.length).toBe(calls)
    expect(await counted(ctx, s.subscriptionId, 0)).toBe(0)

    // Dots inside a segment and other encodings are not dot segments or separators: they go through as written.
    for (const path of ['/echo', '/...', '/.well-known', '/a..b', '/file.txt', '/echo%20x', '/a%3Bb']) {
      const res = await proxy(s, { path })
      expect(res.status).toBe(200)
      expect(upstream.received.at(-1)!.path).toBe(`/api${path}`)
    }
  })

  test('an escape spelled out of escapes (%2%66 is %2f once decoded) is read as a second decoding reads it: 400', async () => {
    const s = await setup()
    const calls = upstream.received.length
    // Decoded once, each is `/..%2fadmin`, `/%2e%2e/admin`, `/x%5c..`, `/%2fadmin`; decoded again, it leaves the base path.
    for (const path of ['/..%2%66admin', '/%2%65%2%65/admin', '/x%5%63..', '/%%32%66admin', '/%2%2566admin']) {
      const refused = expectError(await proxy(s, { path }), 400, 'validation_failed')
      expect({ path, at: refused.details[0].path }).toEqual({ path, at: '/path' })
    }
    expect(upstream.received.length).toBe(calls)
    // What no number of decodings makes a separator or a dot segment still goes through as written.
    for (const path of ['/a%2%20b', '/%2%2e.x', '/100%25']) {
      expect((await proxy(s, { path })).status).toBe(200)
      expect(upstream.received.at(-1)!.path).toBe(`/api${path}`)
    }
  })

  test('a tab or line break, which URLs drop, cannot hide an encoded slash or backslash: 400, the upstream not called', async () => {
    const s = await setup()
    const calls = upstream.received.length
    // Sent as is, the URL parser drops them: the upstream would get /api/..%2fadmin, /api/a/%5c.., /api/%2e%2e/admin.
    // Percent-encoded, one decoding makes them: an upstream that parses the result again drops them too.
    for (const path of ['/..%2\tfadmin', '/a/%5\nc..', '/%2\re%2\te/admin', '/echo\t', '/..%2%09fadmin', '/x%0a', '/%2%0D5c']) {
      const refused = expectError(await proxy(s, { path }), 400, 'validation_failed')
      expect({ path, at: refused.details[0].path }).toEqual({ path, at: '/path' })
    }
    expect(upstream.received.length).toBe(calls)
    expect(await counted(ctx, s.subscriptionId, 0)).toBe(0)
  })

  test('an unreachable upstream is 502, a 5 MiB body is 502, a hanging one is 504 after about 10 s', async () => {
    const s = await setup()
    const closed = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response('') })
    const deadPort = closed.port
    await closed.stop(true)
    await ctx.call('DELETE', `/v1/connections/${(await ctx.call('GET', '/v1/connections', { token: s.user.token })).body.data[0].id}`, {
      token: s.user.token,
    })
    await ctx.call('POST', '/v1/connections', {
      token: s.user.token,
      body: { provider: 'acme', baseUrl: `http://127.0.0.1:${deadPort}`, credential: 'x' },
    })
    expectError(await proxy(s, { path: '/anything' }), 502, 'upstream_unreachable')
    await ctx.call('DELETE', `/v1/connections/${(await ctx.call('GET', '/v1/connections', { token: s.user.token })).body.data[0].id}`, {
      token: s.user.token,
    })
    await ctx.call('POST', '/v1/connections', { token: s.user.token, body: { provider: 'acme', baseUrl: `${upstream.url}/api`, credential: 'x' } })
    expectError(await proxy(s, { path: '/big' }), 502, 'upstream_too_large')
    const started = Date.now()
    expectError(await proxy(s, { path: '/hang' }), 504, 'upstream_timeout')
    const took = Date.now() - started
    expect(took).toBeGreaterThanOrEqual(9_500)
    expect(took).toBeLessThan(15_000)
  }, 30_000)

  test('a HEAD of a resource over 1 MiB answers its status: no body follows, whatever its Content-Length says', async () => {
    const s = await setup()
    const res = await proxy(s, { method: 'HEAD', path: '/big' })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ status: 200, headers: { 'content-type': 'text/plain' }, body: '' })
    expect(upstream.received.at(-1)).toMatchObject({ method: 'HEAD', path: '/api/big' })
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  })

  test('an answer whose body does not decode is 502, and the call counts: the upstream had it', async () => {
    const s = await setup()
    const calls = upstream.received.length
    const res = expectError(await proxy(s, { path: '/bad-gzip' }), 502, 'upstream_unreachable')
    expect(res.message).toBe('The upstream’s answer broke off or could not be decoded')
    expect(upstream.received.length).toBe(calls + 1)
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  })

  test('an answer that is not HTTP (a malformed head, two Content-Lengths) is 502 and counts: the upstream had it; a retry replays', async () => {
    // A raw server: Bun.serve cannot write a malformed answer. It answers each request on its own connection.
    const heads: string[] = []
    const raw = createServer(socket => {
      socket.on('error', () => {})
      socket.once('data', data => {
        const path = data.toString('latin1').split(' ')[1]!
        heads.push(path)
        socket.end(
          path.endsWith('/garbage')
            ? 'NOT HTTP AT ALL\r\n\r\n'
            : 'HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello',
        )
      })
    })
    await new Promise<void>(resolve => raw.listen(0, '127.0.0.1', resolve))
    try {
      const s = await meteredSubscriber(ctx, owner, `http://127.0.0.1:${(raw.address() as AddressInfo).port}`, { includedProxyCalls: 100 })
      for (const [i, path] of ['/garbage', '/two-lengths'].entries()) {
        const headers = { 'idempotency-key': `malformed-${i}` }
        const res = expectError(await proxy(s, { path }, headers), 502, 'upstream_unreachable')
        expect(res.message).toBe('The upstream’s answer broke off or could not be decoded')
        // The same key does not reach the upstream again: the first call is replayed.
        expect(expectError(await proxy(s, { path }, headers), 502, 'upstream_unreachable')).toEqual(res)
      }
      expect(heads).toEqual(['/api/garbage', '/api/two-lengths'])
      expect(await counted(ctx, s.subscriptionId, 2)).toBe(2)
    } finally {
      raw.close()
    }
  })

  test('JSON nested past 512 levels comes back as text, not a 500; nested less, parsed', async () => {
    const s = await setup()
    const shallow = await proxy(s, { path: '/deep/512' })
    expect(shallow.status).toBe(200)
    let level: unknown = shallow.body.data.body
    for (let i = 0; i < 511; i++) level = (level as unknown[])[0]
    expect(level).toEqual([])
    for (const depth of [513, 100_000]) {
      const deep = await proxy(s, { path: `/deep/${depth}` })
      expect(deep.status).toBe(200)
      expect(deep.body.data.body).toBe('['.repeat(depth) + ']'.repeat(depth))
    }
  })

  test('JSON with a number past a double’s range comes back as text, not with null in its place', async () => {
    const s = await setup()
    const res = await proxy(s, { path: '/huge-number' })
    expect(res.status).toBe(200)
    expect(res.body.data.body).toBe('{"id":1e400,"n":[-1e999]}')
  })

  test('a text answer is read in the charset its Content-Type names', async () => {
    const s = await setup()
    const res = await proxy(s, { path: '/latin1' })
    expect(res.body.data).toMatchObject({ status: 200, headers: { 'content-type': 'text/plain; charset=ISO-8859-1' }, body: 'café' })
  })

  test('a connection whose address is no longer allowed is refused at call time', async () => {
    const s = await setup()
    const strict = await createTestContext({ database: ctx.database, env: { REDIS_PREFIX: ctx.config.redisPrefix, CONNECTIONS_KEY: connectionsKey } })
    try {
      const calls = upstream.received.length
      const res = await strict.call('POST', '/v1/agent/proxy-call', {
        apiKey: s.agent.apiKey,
        body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
      })
      expectError(res, 403, 'forbidden')
      expect(upstream.received.length).toBe(calls)
    } finally {
      await strict.close()
    }
  })

  test('200 concurrent calls under one subscription are all counted, exactly', async () => {
    const s = await setup({ includedProxyCalls: 1000 })
    const results = await Promise.all(Array.from({ length: 200 }, () => proxy(s)))
    expect(results.every(r => r.status === 200)).toBe(true)
    expect(results.map(r => r.body.data.usage.periodCalls).sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1))
    expect(await counted(ctx, s.subscriptionId, 200)).toBe(200)
    const events = await ctx.deps.sql<{ id: string }[]>`select id from usage_events where subscription_id = ${s.subscriptionId}`
    expect(events.length).toBe(200)
    // A call without an Idempotency-Key is a time-ordered usage event id.
    for (const { id } of events) expect(id).toMatch(uuidV7)
    const list = await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })
    expect(list.body.data[0].usage).toEqual({ proxyCalls: 200, includedProxyCalls: 1000 })
  })

  test('after Redis lost the live count, calls answer no less than what maintenance has counted since', async () => {
    const redis = await startRedisServer()
    const own = await createTestContext({ env: { REDIS_URL: redis.url, PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: connectionsKey } })
    try {
      const s = await meteredSubscriber(own, await signUp(own), upstream.url, { includedProxyCalls: 3 })
      const usage = async () => {
        const res = await own.call('POST', '/v1/agent/proxy-call', {
          apiKey: s.agent.apiKey,
          body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
        })
        expect(res.status).toBe(200)
        return [res.body.data.usage.periodCalls, res.body.data.usage.overageCalls]
      }
      // No metering worker here: the four calls are recorded, their jobs wait in Redis and are lost with it.
      for (let n = 1; n <= 4; n++) expect(await usage()).toEqual([n, Math.max(0, n - 3)])
      await redis.restart({ keepData: false, downMs: 0 })
      await until(async () => (await own.deps.redis.ping().catch(() => '')) === 'PONG', 10_000)
      // The counter starts again from what Postgres has counted: none of them yet.
      expect((await usage())[0]).toBeGreaterThanOrEqual(1)
      // Maintenance counts the calls whose jobs were lost, a minute after they were recorded (and
      // a metering worker each new call at once): the answers come back to the whole count.
      const countAll = async () => (await countRecorded(own.deps.sql, { before: new Date(Date.now() + 1000) }, new Date())).counted
      expect(await countAll()).toBe(5)
      expect(await usage()).toEqual([6, 3])
      expect(await countAll()).toBe(1)
      expect(await usage()).toEqual([7, 4])
    } finally {
      await own.close()
      await redis.close()
    }
  }, 60_000)

  test('a retry with the same Idempotency-Key reaches the upstream once and is metered once', async () => {
    const s = await setup()
    const headers = { 'idempotency-key': 'proxy-1' }
    const before = upstream.received.length
    const first = await proxy(s, {}, headers)
    const again = await proxy(s, {}, headers)
    expect(again.body).toEqual(first.body)
    expect(upstream.received.length).toBe(before + 1)
    expectError(await proxy(s, { path: '/status/200' }, headers), 409, 'idempotency_key_reused')
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  })

  test('a call’s marker against counting it twice lives two days, its period’s counter to a week past the period', async () => {
    const s = await setup()
    const before = new Set(await ctx.deps.redis.keys(ctx.deps.keys.usageEvent('*')))
    expect((await proxy(s, {})).status).toBe(200)
    const [marker] = (await ctx.deps.redis.keys(ctx.deps.keys.usageEvent('*'))).filter(key => !before.has(key))
    const day = 86_400_000
    const markerMs = await ctx.deps.redis.pttl(marker!)
    expect(markerMs).toBeGreaterThan(2 * day - 60_000)
    expect(markerMs).toBeLessThanOrEqual(2 * day)
    const counter = ctx.deps.keys.usage(s.subscriptionId, 0, ctx.deps.database.current()!).calls
    expect(await ctx.deps.redis.pttl(counter)).toBeGreaterThan(7 * day)
  })

  test('usage thresholds are recorded once at 80 % and 100 % of the included calls', async () => {
    const s = await setup({ includedProxyCalls: 5 })
    for (let i = 0; i < 7; i++) await proxy(s)
    expect(await counted(ctx, s.subscriptionId, 7)).toBe(7)
    const rows = await ctx.deps.sql`select percent from usage_thresholds where subscription_id = ${s.subscriptionId} order by percent`
    expect(rows.map(r => r.percent)).toEqual([80, 100])
  })
})

describe('invoices', () => {
  test('3 included, 10 cents over: 5 calls make one invoice of the monthly price and 2 x 10 cents; a rerun issues nothing', async () => {
    const s = await setup({ includedProxyCalls: 3, overagePerCallCents: 10, monthlyPriceCents: 1000 })
    const usages = []
    for (let i = 0; i < 5; i++) usages.push((await proxy(s)).body.data.usage)
    expect(usages.map(u => [u.periodCalls, u.overageCalls])).toEqual([
      [1, 0],
      [2, 0],
      [3, 0],
      [4, 1],
      [5, 2],
    ])
    expect(await counted(ctx, s.subscriptionId, 5)).toBe(5)
    // The terms change mid-period: this period keeps its terms, the next one gets the more included calls
    // (the higher price waits a period more: test/billing-plans.test.ts).
    await ctx.call('PATCH', `/v1/billing/plans/${s.planId}`, { token: owner.token, body: { monthlyPriceCents: 2000, includedProxyCalls: 50 } })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd)
    const at = new Date(end.getTime() + 60_000)
    const deps = ctx.deps
    const run = await runInvoices(deps, at)
    expect(run.issued).toBeGreaterThanOrEqual(1)
    const invoices = (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
    expect(invoices.length).toBe(1)
    expect(invoices[0]).toMatchObject({
      participantId: s.agent.id,
      subscriptionId: s.subscriptionId,
      periodStart: sub.currentPeriodStart,
      periodEnd: sub.currentPeriodEnd,
      totalCents: 1020,
      status: 'issued',
      lines: [
        { kind: 'subscription', quantity: 1, unitPriceCents: 1000, amountCents: 1000 },
        { kind: 'overage', quantity: 2, unitPriceCents: 10, amountCents: 20 },
      ],
    })
    expect((await runInvoices(deps, at)).issued).toBe(0)
    expect((await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data.length).toBe(1)

    const status = (await ctx.call('GET', '/v1/agent/status', { apiKey: s.agent.apiKey })).body.data
    expect(status.balanceCents).toBe(1020)
    ctx.clock.set(at)
    const stats = (await ctx.call('GET', '/v1/billing/creator-stats', { token: owner.token })).body.data
    expect(stats.agents.find((a: { participantId: string }) => a.participantId === s.agent.id).revenueCents).toBe(1020)
    const next = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    ctx.clock.set(new Date())
    expect(next.currentPeriodStart).toBe(sub.currentPeriodEnd)
    expect(next.currentPeriodEnd).toBe(addMonths(new Date(sub.currentPeriodStart), 2).toISOString())
    expect(next.usage).toEqual({ proxyCalls: 0, includedProxyCalls: 50 })
  })

  test('every ended month is invoiced once with sequential numbers, quiet months too; a cancelled subscription stops after its last period', async () => {
    const started = new Date('2024-01-31T09:00:00.000Z')
    ctx.clock.freeze(started)
    const s = await setup({ includedProxyCalls: 0, overagePerCallCents: 0, monthlyPriceCents: 500 })
    const other = await setup({ monthlyPriceCents: 700 })
    ctx.clock.freeze(new Date('2024-03-15T00:00:00.000Z'))
    await ctx.call('DELETE', `/v1/billing/subscriptions/${other.subscriptionId}`, { token: other.user.token })
    ctx.clock.set(new Date())
    const deps = ctx.deps
    await runInvoices(deps, new Date('2024-06-01T00:00:00.000Z'))
    const mine = (await ctx.call('GET', '/v1/billing/invoices?limit=100', { token: s.user.token })).body.data
    expect(mine.map((i: { periodStart: string }) => i.periodStart).reverse()).toEqual([
      '2024-01-31T09:00:00.000Z',
      '2024-02-29T09:00:00.000Z',
      '2024-03-31T09:00:00.000Z',
      '2024-04-30T09:00:00.000Z',
    ])
    expect(mine.every((i: { totalCents: number }) => i.totalCents === 500)).toBe(true)
    const theirs = (await ctx.call('GET', '/v1/billing/invoices?limit=100', { token: other.user.token })).body.data
    // subscribed Jan 31, cancelled Mar 15: invoiced for the periods from Jan 31 and Feb 29 only
    expect(theirs.map((i: { periodStart: string }) => i.periodStart).reverse()).toEqual(['2024-01-31T09:00:00.000Z', '2024-02-29T09:00:00.000Z'])
    await runInvoices(deps, new Date('2024-12-01T00:00:00.000Z'))
    expect((await ctx.call('GET', '/v1/billing/invoices?limit=100', { token: other.user.token })).body.data.length).toBe(2)
    const numbers = (await ctx.deps.sql<{ number: number }[]>`select number from invoices order by number`).map(r => r.number)
    expect(numbers).toEqual(Array.from({ length: numbers.length }, (_, i) => i + 1))
  })
})

describe('an invoice run’s batch', () => {
  test('runs at once date a payer’s invoices apart, so paging them by `before` skips none', async () => {
    ctx.clock.freeze(new Date('2023-01-10T09:00:00.000Z'))
    const s = await setup({ monthlyPriceCents: 300 })
    ctx.clock.set(new Date())
    // Batches of one period, four runs at once: the payer's seven periods are issued by concurrent
    // statements at one run time, each of which must see the invoices committed before it.
    const at = new Date('2023-09-01T00:00:00.000Z')
    await Promise.all(Array.from({ length: 4 }, () => runInvoices(ctx.deps, at, { batchSize: 1 })))
    const seen: string[] = []
    let before = ''
    for (;;) {
      const page = (await ctx.call('GET', `/v1/billing/invoices?limit=1${before}`, { token: s.user.token })).body.data
      if (page.length === 0) break
      seen.push(page[0].periodStart)
      before = `&before=${encodeURIComponent(page[0].issuedAt)}`
    }
    expect(seen.reverse()).toEqual(Array.from({ length: 7 }, (_, i) => `2023-0${i + 1}-10T09:00:00.000Z`))
  })

  test('reads the due periods in an index’s order from where the run got to, and stops at its limit', async () => {
    // Planned as for a large table (no sequential scan, no sort where an index gives the order):
    // without an index in the run's order the plan sorts every due period for each batch, which made
    // a run of a million quadratic; without the run's cursor in the index condition, each batch steps
    // over the entries of those issued. With statistics of these few rows (autovacuum's analyze runs
    // when it will), PostgreSQL 13 and 14 price sorting them below reading the index.
    const explain = (after?: { periodEnd: Date; subscriptionId: string; periodIndex: number }) =>
      ctx.deps.sql.begin(async tx => {
        await tx`analyze subscription_periods, subscriptions, plans`
        await tx`set local enable_seqscan = off`
        await tx`set local enable_sort = off`
        const plan = await tx<{ 'QUERY PLAN': string }[]>`explain ${duePeriods(tx, new Date(), 5000, after)}`
        return plan.map(row => row['QUERY PLAN']).join('\n')
      })
    const first = await explain()
    expect(first).toContain('Index Scan using subscription_periods_due')
    expect(first).not.toMatch(/Sort/)
    const next = await explain({ periodEnd: new Date(), subscriptionId: '00000000-0000-4000-8000-000000000000', periodIndex: 0 })
    expect(next).toContain('Index Scan using subscription_periods_due')
    expect(next).toMatch(/Index Cond: .*ROW\(period_end, subscription_id, period_index\) > ROW/)
    expect(next).not.toMatch(/Sort/)
  })
})

describe('creator stats', () => {
  test('find each agent’s subscriptions, cancelled ones too, through an index: never a scan of every subscription', async () => {
    // Planned as for a large table: without an index of all of an agent's subscriptions, each of the
    // owner's agents scanned the whole table (an owner of 10,000 agents: 503 after the 30 s timeout).
    const plan = await ctx.deps.sql.begin(async tx => {
      await tx`set local enable_seqscan = off`
      const month = { start: new Date('2024-01-01T00:00:00.000Z'), end: new Date('2024-02-01T00:00:00.000Z') }
      const rows = await tx<{ 'QUERY PLAN': string }[]>`explain ${agentStats(tx, randomUUID(), month)}`
      return rows.map(row => row['QUERY PLAN']).join('\n')
    })
    expect(plan).toContain('subscriptions_by_agent')
    expect(plan).not.toMatch(/Seq Scan on subscriptions/)
  })
})

describe('the run’s periods of every subscription', () => {
  test('are made for every subscription that lacks them, each once, and counted', async () => {
    const started = new Date('2023-05-10T12:00:00.000Z')
    ctx.clock.freeze(started)
    for (let i = 0; i < 5; i++) await setup()
    ctx.clock.set(new Date())
    const at = addMonths(started, 3)
    const periods = async () => (await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from subscription_periods`)[0]!.n
    const before = await periods()
    const created = await ensurePeriods(ctx.deps.sql, at)
    expect(created).toBe((await periods()) - before)
    expect(created).toBeGreaterThanOrEqual(15)
    const [uncovered] = await ctx.deps.sql<{ n: number }[]>`
      select count(*)::int as n from subscriptions s
      where s.started_at <= ${at} and not exists (
        select 1 from subscription_periods p
        where p.subscription_id = s.id and p.period_start <= least(${at}::timestamptz, coalesce(s.cancelled_at, ${at}::timestamptz))
          and least(${at}::timestamptz, coalesce(s.cancelled_at, ${at}::timestamptz)) < p.period_end)
    `
    expect(uncovered!.n).toBe(0)
    expect(await ensurePeriods(ctx.deps.sql, at)).toBe(0)
  })
})

describe('invoice amounts', () => {
  test('an overage past 2^31 cents is invoiced exactly, and does not hold up the other invoices of the run', async () => {
    const big = await setup({ monthlyPriceCents: 1000, includedProxyCalls: 0, overagePerCallCents: 100_000 })
    const small = await setup({ monthlyPriceCents: 700, includedProxyCalls: 0, overagePerCallCents: 0 })
    // 25,000 calls at 1,000 dollars each, as the metering worker would have counted them.
    await ctx.deps.sql`update subscription_periods set proxy_calls = 25000 where subscription_id = ${big.subscriptionId}`
    const ends = await Promise.all(
      [big, small].map(async s =>
        new Date((await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0].currentPeriodEnd).getTime(),
      ),
    )
    await runInvoices(ctx.deps, new Date(Math.max(...ends) + 60_000))
    const [invoice] = (await ctx.call('GET', '/v1/billing/invoices', { token: big.user.token })).body.data
    expect(invoice.totalCents).toBe(1000 + 25_000 * 100_000)
    expect(invoice.lines[1]).toEqual({
      kind: 'overage',
      description: expect.any(String),
      quantity: 25_000,
      unitPriceCents: 100_000,
      amountCents: 2_500_000_000,
    })
    expect((await ctx.call('GET', '/v1/billing/invoices', { token: small.user.token })).body.data).toHaveLength(1)
  })
})

describe('when a period is invoiced', () => {
  test('a minute after it ended: a call begun before its end and metered after is on its invoice; later ones are flagged', async () => {
    const s = await setup({ monthlyPriceCents: 1000, includedProxyCalls: 0, overagePerCallCents: 100 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd).getTime()
    const runDeps = ctx.deps
    const invoices = async () => (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
    /** A call's usage, recorded and counted as its metering job does. */
    const usage = async (offsetMs: number, countedAfterMs: number) => {
      const eventId = crypto.randomUUID()
      await recordUsage(ctx.deps.sql, {
        eventId,
        subscriptionId: s.subscriptionId,
        periodIndex: 0,
        occurredAt: new Date(end + offsetMs).toISOString(),
      })
      return countRecorded(ctx.deps.sql, { ids: [eventId] }, new Date(end + countedAfterMs))
    }

    await runInvoices(runDeps, new Date(end + 30_000))
    expect(await invoices()).toEqual([])
    // A call started a second before the end whose answer (and metering) came after it.
    expect(await usage(-1000, 40_000)).toEqual({ taken: 1, counted: 1, late: 0 })
    await runInvoices(runDeps, new Date(end + 61_000))
    const [invoice] = await invoices()
    expect(invoice.totalCents).toBe(1100)
    // One metered later still is counted, and flagged: it is on no invoice.
    expect(await usage(-2000, 120_000)).toEqual({ taken: 1, counted: 1, late: 1 })
  })
})

describe('invoice announcements', () => {
  const runDeps = () => ctx.deps
  const flat = { monthlyPriceCents: 900, includedProxyCalls: 0, overagePerCallCents: 0 }
  /** A minute after the subscription's current period ends. */
  const dueAfter = async (s: Setup) => {
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    return new Date(new Date(sub.currentPeriodEnd).getTime() + 60_000)
  }
  /** The `invoice.issued` events in the user's stream, as their clients would read them. */
  const invoiceEvents = async (userId: string) =>
    (await ctx.deps.redis.xrange(ctx.deps.keys.events.user(userId), '-', '+'))
      .filter(([, fields]) => fields[1] === 'invoice.issued')
      .map(([, fields]) => JSON.parse(fields[3]!))

  test('a run announces each invoice to its payer, once', async () => {
    const s = await setup(flat)
    await runInvoices(runDeps(), await dueAfter(s))
    const [invoice] = (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
    await until(async () => (await invoiceEvents(s.user.id)).length > 0)
    expect(await invoiceEvents(s.user.id)).toEqual([
      expect.objectContaining({ type: 'invoice.issued', invoiceId: invoice.id, number: invoice.number, totalCents: 900 }),
    ])
  })

  test('a run’s invoices have ids in time order (UUIDv7 of when each was inserted), as their numbers go', async () => {
    const subs = [await setup(flat), await setup(flat), await setup(flat)]
    const at = new Date(Math.max(...(await Promise.all(subs.map(dueAfter))).map(d => d.getTime())))
    // Postgres's clock, which the ids carry (the database may be on another host).
    const clock = async () =>
      Number((await ctx.deps.sql<{ ms: string }[]>`select floor(extract(epoch from clock_timestamp()) * 1000)::bigint as ms`)[0]!.ms)
    const before = await clock()
    // A batch of one a statement: three statements, so the ids span the run's time.
    while ((await issueDueInvoices(ctx.deps.sql, { endedBy: at, issuedAt: at }, 1)).issued > 0) await Bun.sleep(2)
    const after = await clock()
    const invoices = await ctx.deps.sql<{ id: string; number: number }[]>`
      select i.id, i.number from invoices i join subscriptions s on s.id = i.subscription_id
      where s.user_id = any(${subs.map(s => s.user.id)}::uuid[]) order by i.number
    `
    expect(invoices.length).toBe(3)
    const times = invoices.map(({ id }) => {
      expect(id).toMatch(uuidV7)
      return parseInt(id.replace(/-/g, '').slice(0, 12), 16)
    })
    for (const time of times) expect(time >= before && time <= after).toBe(true)
    expect(times).toEqual([...times].sort((a, b) => a - b))
    expect(new Set(times).size).toBe(3)
  })

  test('each batch records its events with its invoices: every invoice of many small batches is announced once', async () => {
    const subs = [await setup(flat), await setup(flat), await setup(flat)]
    const at = new Date(Math.max(...(await Promise.all(subs.map(dueAfter))).map(d => d.getTime())))
    let batches = 0
    while ((await issueDueInvoices(ctx.deps.sql, { endedBy: at, issuedAt: at }, 1)).issued > 0) batches++
    expect(batches).toBeGreaterThanOrEqual(3)
    for (const s of subs) await until(async () => (await invoiceEvents(s.user.id)).length > 0)
    await ctx.relay!.drain()
    for (const s of subs) {
      const [invoice] = (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
      expect(await invoiceEvents(s.user.id)).toEqual([expect.objectContaining({ invoiceId: invoice.id, number: invoice.number })])
    }
  })
})

describe('usage whose metering job was lost', () => {
  const proxyThrough = (c: TestContext, s: Setup) =>
    c.call('POST', '/v1/agent/proxy-call', {
      apiKey: s.agent.apiKey,
      body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
    })

  test('is recorded before the call is answered, and counted by maintenance a minute later', async () => {
    // A process whose metering queue no worker reads (another prefix): its jobs are as good as lost with Redis.
    const lost = await createTestContext({
      database: ctx.database,
      env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: connectionsKey },
    })
    try {
      const s = await meteredSubscriber(lost, await signUp(lost), upstream.url, { includedProxyCalls: 1, overagePerCallCents: 10 })
      const calls = [] as number[]
      for (let i = 0; i < 3; i++) calls.push((await proxyThrough(lost, s)).status)
      expect(calls).toEqual([200, 200, 200])
      // Recorded, waiting to be counted.
      const waiting = async () => [
        await int(ctx.deps.sql`select count(*)::int as n from usage_uncounted where subscription_id = ${s.subscriptionId}`),
        await int(ctx.deps.sql`select count(*)::int as n from usage_events where subscription_id = ${s.subscriptionId}`),
      ]
      expect(await waiting()).toEqual([3, 0])
      // Maintenance counts what is still uncounted a minute after it was recorded.
      expect((await runMaintenance(lost.deps)).usageEvents).toBe(0)
      lost.clock.advance(61_000)
      expect((await runMaintenance(lost.deps)).usageEvents).toBe(3)
      expect(await counted(ctx, s.subscriptionId, 3)).toBe(3)
      expect(await waiting()).toEqual([0, 3])
      expect((await runMaintenance(lost.deps)).usageEvents).toBe(0)
    } finally {
      await lost.close()
    }
  })

  test('the invoice run counts what is left before it bills a period', async () => {
    const lost = await createTestContext({
      database: ctx.database,
      env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: connectionsKey },
    })
    try {
      const s = await meteredSubscriber(lost, await signUp(lost), upstream.url, {
        monthlyPriceCents: 500,
        includedProxyCalls: 0,
        overagePerCallCents: 7,
      })
      for (let i = 0; i < 2; i++) expect((await proxyThrough(lost, s)).status).toBe(200)
      const sub = (await lost.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
      await runInvoices(lost.deps, new Date(new Date(sub.currentPeriodEnd).getTime() + 60_000))
      const [invoice] = (await lost.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
      expect(invoice.totalCents).toBe(500 + 2 * 7)
    } finally {
      await lost.close()
    }
  })
})

describe('a call of a subscription cancelled meanwhile', () => {
  test('counts in the period it was cancelled in, even when the call falls in the next', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    expect((await ctx.call('DELETE', `/v1/billing/subscriptions/${s.subscriptionId}`, { token: s.user.token })).status).toBe(200)
    // Checked while active; answered by the upstream just after the period it was cancelled in.
    const occurredAt = new Date(new Date(sub.currentPeriodEnd).getTime() + 1000)
    const eventId = crypto.randomUUID()
    const usage = await meterCall(ctx.deps, {
      eventId,
      subscription: { id: s.subscriptionId, startedAt: new Date(sub.currentPeriodStart) },
      occurredAt,
    })
    expect(usage.periodCalls).toBe(1)
    const [row] = await ctx.deps.sql<{ periodIndex: number }[]>`
      select period_index as "periodIndex" from usage_uncounted where id = ${eventId}
      union all select period_index from usage_events where id = ${eventId}
    `
    expect(row!.periodIndex).toBe(0)
  })
})

describe('a cancellation racing the invoice run at the end of a period', () => {
  const lockWaits = () =>
    int(ctx.deps.sql`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)
  // The cancellations held on a lock go through a process of this deployment with no lock timeout:
  // a loaded machine's pace is no race against the requests' 2 s.
  let patient: TestContext
  beforeAll(async () => {
    // A Redis prefix of its own (its close deletes its keys) and no relay: the file's events stay the file's.
    patient = await createTestContext({ database: ctx.database, env: { DATABASE_LOCK_TIMEOUT_MS: '0' }, relay: false })
  })
  afterAll(() => patient.close())

  test('a run that met a cancellation dated before the period ended makes no period after it', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd).getTime()
    // The cancellation's last statement (its event) waits here, the subscription locked by it.
    const release = await holdOpen(ctx.deps.workerSql, tx => tx`lock table outbox in share mode`)
    try {
      // Cancelled a second before its first period ended; the run, a minute after, reads it active.
      patient.clock.set(new Date(end - 1000))
      const cancel = patient.call('DELETE', `/v1/billing/subscriptions/${s.subscriptionId}`, { token: s.user.token })
      await until(async () => (await lockWaits()) === 1)
      // The run's first statement, making the periods begun by then (of this subscription only: of every
      // one in this file's database, it could outlast the held cancellation's lock timeout). It waits
      // for the cancellation, or is done without.
      const periodsMade = ensurePeriods(forInvoiceRun(ctx.deps).sql, new Date(end + 61_000), s.subscriptionId)
      await Promise.race([periodsMade, until(async () => (await lockWaits()) === 2)])
      await release()
      expect((await cancel).status).toBe(200)
      await periodsMade
    } finally {
      await release()
      patient.clock.set(new Date())
    }
    await runInvoices(forInvoiceRun(ctx.deps), new Date(end + 61_000))
    // Its one period, the one it was cancelled in, is its last: no month after it is made, nor billed.
    const periods = await ctx.deps.sql<{ periodIndex: number }[]>`
      select period_index as "periodIndex" from subscription_periods where subscription_id = ${s.subscriptionId} order by 1
    `
    expect(periods.map(p => p.periodIndex)).toEqual([0])
    const [after] = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data
    expect(after).toMatchObject({ status: 'cancelled', currentPeriodStart: sub.currentPeriodStart })
    const invoices = (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
    expect(invoices.map((i: { periodStart: string }) => i.periodStart)).toEqual([sub.currentPeriodStart])
  }, 30_000)

  test('a cancellation dated before the period ended, that found the next one made, is dated in it', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd).getTime()
    // The cancellation waits here before it locks the subscription (its agent's row first).
    const release = await holdOpen(ctx.deps.workerSql, tx => tx`select 1 from participants where id = ${s.agent.id} for share`)
    let cancelled
    try {
      patient.clock.set(new Date(end - 1000))
      const cancel = patient.call('DELETE', `/v1/billing/subscriptions/${s.subscriptionId}`, { token: s.user.token })
      await until(async () => (await lockWaits()) === 1)
      // Meanwhile the run (or a call, or a list) finds it active a minute after the period ended, and makes the next.
      expect(await ensurePeriods(forInvoiceRun(ctx.deps).sql, new Date(end + 61_000), s.subscriptionId)).toBe(1)
      await release()
      cancelled = await cancel
    } finally {
      await release()
      patient.clock.set(new Date())
    }
    expect(cancelled.status).toBe(200)
    // The period it was cancelled in is the last it has, and the one it shows.
    const { cancelledAt, currentPeriodStart } = cancelled.body.data
    expect(currentPeriodStart).toBe(sub.currentPeriodEnd)
    expect(new Date(cancelledAt).getTime()).toBeGreaterThanOrEqual(new Date(currentPeriodStart).getTime())
    const [late] = await ctx.deps.sql<{ n: number }[]>`
      select count(*)::int as n from subscription_periods sp join subscriptions s on s.id = sp.subscription_id
      where s.id = ${s.subscriptionId} and sp.period_start > s.cancelled_at
    `
    expect(late!.n).toBe(0)
  }, 30_000)

  test('so is a deactivation of the agent dated before the period ended, that found the next one made', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd).getTime()
    // Made by a statement that read the subscription active after the period ended, before the deactivation took its locks.
    expect(await ensurePeriods(forInvoiceRun(ctx.deps).sql, new Date(end + 61_000), s.subscriptionId)).toBe(1)
    try {
      ctx.clock.set(new Date(end - 1000))
      expect((await ctx.call('DELETE', `/v1/participants/${s.agent.id}`, { token: owner.token })).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }
    const [after] = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data
    expect(after.status).toBe('cancelled')
    expect(after.currentPeriodStart).toBe(sub.currentPeriodEnd)
    expect(new Date(after.cancelledAt).getTime()).toBeGreaterThanOrEqual(end)
  })

  test('nor does one that met the deactivation of the agent, dated before the period ended', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const end = new Date(sub.currentPeriodEnd).getTime()
    // The agent deactivated a second before the period ended (as DELETE /v1/participants/{id} does), not committed yet.
    const release = await holdOpen(ctx.deps.workerSql, async tx => {
      await tx`select 1 from participants where id = ${s.agent.id} for update`
      await deactivateAgent(tx, s.agent.id, owner.id, new Date(end - 1000))
    })
    const run = runInvoices(forInvoiceRun(ctx.deps), new Date(end + 61_000))
    try {
      // Either the run waits for the deactivation, or it is done without.
      await Promise.race([run, until(async () => (await lockWaits()) === 1)])
    } finally {
      await release()
      await run
    }
    const periods = await ctx.deps.sql<{ periodIndex: number }[]>`
      select period_index as "periodIndex" from subscription_periods where subscription_id = ${s.subscriptionId} order by 1
    `
    expect(periods.map(p => p.periodIndex)).toEqual([0])
  }, 30_000)
})

describe('counting beside other counters', () => {
  test('a run with thousands left to count, beside four other counters, bills every one of them', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })).body.data[0]
    const [start, end] = [new Date(sub.currentPeriodStart).getTime(), new Date(sub.currentPeriodEnd).getTime()]
    // 2,500 calls of the period recorded, whose jobs were lost.
    await ctx.deps.sql`
      insert into usage_uncounted (id, subscription_id, period_index, occurred_at)
      select gen_random_uuid(), ${s.subscriptionId}, 0, ${new Date(start)}::timestamptz + g * interval '1 second'
      from generate_series(1, 2500) g
    `
    const counter = async () => {
      for (;;) if ((await countRecorded(ctx.deps.sql, { before: new Date(end), limit: 100 }, new Date())).taken === 0) return
    }
    await Promise.all([counter(), counter(), counter(), counter(), runInvoices(ctx.deps, new Date(end + 60_000))])
    const [invoice] = (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data
    expect(invoice.totalCents).toBe(100 + 2500)
    expect(await int(ctx.deps.sql`select count(*)::int as n from usage_uncounted where subscription_id = ${s.subscriptionId}`)).toBe(0)
  })
})

describe('the invoices worker', () => {
  test('dates a run asked for up to a minute ahead by the database’s clock: a period that just ended waits its minute', async () => {
    const s = await setup({ monthlyPriceCents: 300, includedProxyCalls: 0, overagePerCallCents: 0 })
    // Its first period ended 5 s ago, by the database's clock.
    await ctx.deps.sql`delete from subscription_periods where subscription_id = ${s.subscriptionId}`
    await ctx.deps.sql`update subscriptions set started_at = now() - interval '1 month' - interval '5 seconds' where id = ${s.subscriptionId}`
    const invoices = async () => (await ctx.call('GET', '/v1/billing/invoices', { token: s.user.token })).body.data as unknown[]
    const run = invoiceProcessor(ctx.deps)
    await run({ data: { at: new Date(Date.now() + 58_000).toISOString() } } as Job)
    expect(await invoices()).toEqual([])
    // Once the minute has passed (the period moved back instead of waiting), it is billed.
    await ctx.deps.sql`update subscriptions set started_at = started_at - interval '1 minute' where id = ${s.subscriptionId}`
    await ctx.deps.sql`delete from subscription_periods where subscription_id = ${s.subscriptionId}`
    await run({ data: { at: new Date().toISOString() } } as Job)
    expect(await invoices()).toHaveLength(1)
  })

  test('refuses a run dated in the future (it would bill periods still running), without retries', async () => {
    const run = invoiceProcessor(ctx.deps)
    const ahead = new Date(ctx.clock.now().getTime() + 32 * 86_400_000).toISOString()
    await expect(run({ data: { at: ahead } } as Job)).rejects.toMatchObject({ name: 'UnrecoverableError' })
    await expect(run({ data: { at: 'soon' } } as Job)).rejects.toMatchObject({ name: 'UnrecoverableError' })
  })
})

/**
 * An invoice run caught making the new periods of `s` and of another subscriber: the run makes every
 * subscription's in one statement, seconds long with many subscriptions, and holds each period it
 * made until it commits. A trigger on the other subscription's new period, waiting for a lock held
 * here at the statement's end (where its foreign keys are checked), stands in for the rest of that
 * statement (a lock on the other subscription's row would have it passed over, as one being cancelled
 * is). `waitsFor` starts what should wait for the run's period
 * (`s`'s, begun at `end`), checks that it still waits past the requests' lock timeout, then lets
 * the run go and returns what it answered.
 */
async function heldRun<T>(s: MeteredSubscriber, waitsFor: (sub: { currentPeriodStart: string; end: number }) => Promise<T>): Promise<T> {
  const other = await setup()
  const current = async (c: MeteredSubscriber) => (await ctx.call('GET', '/v1/billing/subscriptions', { token: c.user.token })).body.data[0]
  const [sub, otherSub] = [await current(s), await current(other)]
  const end = new Date(sub.currentPeriodEnd).getTime()
  const at = new Date(Math.max(end, new Date(otherSub.currentPeriodEnd).getTime()) + 1000)
  let release!: () => void
  const held = new Promise<void>(resolve => (release = resolve))
  const lockKey = 4242
  await ctx.deps.sql.unsafe(`
    create or replace function test_held_run() returns trigger language plpgsql
    as $$ begin perform pg_advisory_xact_lock_shared(${lockKey}); return null; end $$
  `)
  await ctx.deps.sql.unsafe(`
    create trigger test_held_run after insert on subscription_periods for each row
    when (new.subscription_id = '${other.subscriptionId}') execute function test_held_run()
  `)
  let locked!: () => void
  const lockTaken = new Promise<void>(resolve => (locked = resolve))
  const holding = ctx.deps.workerSql.begin(async tx => {
    await tx`select pg_advisory_xact_lock(${lockKey})`
    locked()
    await held
  })
  await lockTaken
  const run = runInvoices(forInvoiceRun(ctx.deps), at)
  const lockWaits = () =>
    int(ctx.deps.sql`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`)
  try {
    await until(async () => (await lockWaits()) === 1)
    const waiting = waitsFor({ currentPeriodStart: sub.currentPeriodStart, end })
    await until(async () => (await lockWaits()) === 2)
    // Past the requests' lock timeout while the run still holds the period.
    const early = await Promise.race([waiting, Bun.sleep(ctx.config.lockTimeoutMs + 1000).then(() => 'waiting')])
    expect(early).toBe('waiting')
    release()
    return await waiting
  } finally {
    release()
    await holding
    await run
    await ctx.deps.sql`drop trigger test_held_run on subscription_periods`
  }
}

describe('a call metered while an invoice run makes its period', () => {
  test('waits for the run past the lock timeout instead of failing unmetered', async () => {
    const s = await setup({ monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 1 })
    const metered = await heldRun(s, ({ currentPeriodStart, end }) =>
      meterCall(ctx.deps, {
        eventId: randomUUID(),
        subscription: { id: s.subscriptionId, startedAt: new Date(currentPeriodStart) },
        occurredAt: new Date(end + 500),
      }).then(
        usage => ({ usage }),
        (error: Error) => ({ error: error.message }),
      ),
    )
    expect(metered).toEqual({ usage: { periodCalls: 1, includedProxyCalls: 0, overageCalls: 1 } })
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  }, 30_000)
})

describe('a subscription read while an invoice run makes its period', () => {
  test('waits for the run past the lock timeout instead of answering 503', async () => {
    const s = await setup()
    let end = 0
    try {
      const res = await heldRun(s, period => {
        end = period.end
        ctx.clock.set(new Date(end + 500))
        return ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })
      })
      expect(res.status).toBe(200)
      // The new period, which the run made.
      expect(new Date(res.body.data[0].currentPeriodStart).getTime()).toBe(end)
    } finally {
      ctx.clock.set(new Date())
    }
  }, 30_000)
})
