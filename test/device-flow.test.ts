import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { connect } from 'node:net'
import { hashDeviceCode } from '../src/auth/device-flow.ts'
import { createSql, type Sql } from '../src/db.ts'
import { migrate, readMigrations } from '../src/migrate.ts'
import { createTestDatabase } from './helpers/database.ts'
import { createAgent, createTestContext, expectError, signUp, type CallResult, type TestContext, type TestUser } from './helpers/context.ts'
import { until } from './helpers/until.ts'

const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
const userCodeShape = /^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/
const unknownCode = '00000000-0000-4000-8000-000000000000'

/** Every limit generous except the ones a test narrows; RATE_LIMITS replaces the helper's own list. */
function rateLimits(overrides: Record<string, { capacity: number; perSeconds: number }>) {
  const plenty = { capacity: 10000, perSeconds: 1 }
  return JSON.stringify({
    deviceCodeCreate: plenty,
    deviceCodePoll: plenty,
    deviceCodeApprove: plenty,
    deviceCodeMisses: plenty,
    apiKeyCreate: plenty,
    participantCreate: plenty,
    ...overrides,
  })
}

interface Started {
  deviceCode: string
  userCode: string
  verificationUri: string
  verificationUriComplete: string
  expiresIn: number
  interval: number
}

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(() => ctx.close())

async function start(c: TestContext = ctx): Promise<Started> {
  const res = await c.call('POST', '/v1/auth/device-codes')
  expect(res.status).toBe(201)
  return res.body.data
}

const poll = (deviceCode: string, c: TestContext = ctx) => c.call('GET', `/v1/auth/device-codes/${deviceCode}`)

/** Polls once the advertised interval has passed, as a well-behaved device does. */
function pollLater(deviceCode: string, c: TestContext = ctx) {
  c.clock.advance(5000)
  return poll(deviceCode, c)
}

const decide = (user: TestUser | undefined, userCode: string, body?: unknown, c: TestContext = ctx) =>
  c.call('PATCH', `/v1/auth/device-codes/${encodeURIComponent(userCode)}`, { token: user?.token, body })

function expectRetryAfter(res: CallResult): number {
  const header = res.headers.get('retry-after')
  expect(header).toMatch(/^[0-9]+$/)
  const seconds = Number(header)
  expect(seconds).toBeGreaterThanOrEqual(1)
  return seconds
}

describe('starting a device authorization', () => {
  test('returns 201 with a uuid device code, an XXXX-XXXX user code and where to enter it', async () => {
    const res = await ctx.call('POST', '/v1/auth/device-codes')
    expect(res.status).toBe(201)
    expect(res.body.success).toBe(true)
    const data = res.body.data
    expect(Object.keys(data).sort()).toEqual(['deviceCode', 'expiresIn', 'interval', 'userCode', 'verificationUri', 'verificationUriComplete'])
    expect(data.deviceCode).toMatch(uuid)
    expect(data.userCode).toMatch(userCodeShape)
    expect(data).toMatchObject({ verificationUri: 'http://test.local/device', expiresIn: 900, interval: 5 })
    expect(data.verificationUriComplete).toStartWith('http://test.local/device?')
    expect(new URL(data.verificationUriComplete).searchParams.get('user_code')).toBe(data.userCode)
  })

  test('each start gets its own device code and user code', async () => {
    const codes = await Promise.all(Array.from({ length: 10 }, () => start()))
    expect(new Set(codes.map(c => c.deviceCode)).size).toBe(10)
    expect(new Set(codes.map(c => c.userCode)).size).toBe(10)
  })

  test('needs no credential, and ignores a bad one rather than failing', async () => {
    const res = await ctx.call('POST', '/v1/auth/device-codes', { token: 'garbage' })
    expect(res.status).toBe(201)
  })
})

describe('polling', () => {
  test('a fresh code is pending; polling again at once is 429 slow_down with Retry-After', async () => {
    const { deviceCode } = await start()
    const first = await poll(deviceCode)
    expect(first.status).toBe(200)
    expect(first.body).toEqual({ success: true, data: { status: 'pending' } })
    const tooSoon = await poll(deviceCode)
    expectError(tooSoon, 429, 'slow_down')
    expect(expectRetryAfter(tooSoon)).toBe(5)
    ctx.clock.advance(3000)
    expectError(await poll(deviceCode), 429, 'slow_down')
    const later = await pollLater(deviceCode)
    expect(later.status).toBe(200)
    expect(later.body.data).toEqual({ status: 'pending' })
  })

  test('a non-uuid or unknown device code is 404 not_found', async () => {
    expectError(await poll('not-a-uuid'), 404, 'not_found')
    expectError(await poll('BCDF-GHJK'), 404, 'not_found')
    expectError(await poll(unknownCode), 404, 'not_found')
  })

  test('a code past its 900 s is expired, and can no longer be approved', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    ctx.clock.advance(899_000)
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'pending' })
    ctx.clock.advance(2000)
    expectError(await decide(user, userCode), 404, 'not_found')
    const res = await pollLater(deviceCode)
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ status: 'expired' })
  })

  test('an approval not collected before the code expires is never delivered', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await decide(user, userCode)).status).toBe(200)
    ctx.clock.advance(901_000)
    const res = await poll(deviceCode)
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ status: 'expired' })
    const [row] = await ctx.deps.sql`select count(*)::int as n from api_keys where user_id = ${user.id}`
    expect(row).toEqual({ n: 0 })
  })
})

describe('approving', () => {
  test.each([
    ['as shown', (code: string) => code],
    ['in lower case', (code: string) => code.toLowerCase()],
    ['without the hyphen', (code: string) => code.replace('-', '')],
    ['in lower case without the hyphen', (code: string) => code.replace('-', '').toLowerCase()],
  ])('a user code entered %s delivers a working user key once, then the code is spent', async (_, entered) => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'pending' })

    const approved = await decide(user, entered(userCode))
    expect(approved.status).toBe(200)
    expect(approved.body).toEqual({ success: true, data: { status: 'approved' } })

    const delivered = await pollLater(deviceCode)
    expect(delivered.status).toBe(200)
    expect(delivered.body.data).toEqual({
      status: 'approved',
      apiKey: expect.stringMatching(/^sk_usr_[0-9A-Za-z]{38}$/),
      user: { id: user.id, email: `${user.sub}@example.com` },
    })
    const apiKey: string = delivered.body.data.apiKey

    const me = await ctx.call('GET', '/v1/auth/me', { token: apiKey })
    expect(me.status).toBe(200)
    expect(me.body.data.id).toBe(user.id)
    const keys = await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })
    expect(keys.body.data).toEqual([expect.objectContaining({ prefix: apiKey.slice(0, 12), name: expect.stringMatching(/^Device authorization/) })])

    expectError(await pollLater(deviceCode), 404, 'not_found')
    expectError(await decide(user, userCode), 404, 'not_found')
  })

  test('a HEAD of an approved code delivers nothing, spends nothing and counts as no poll: the next GET gets the key', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await decide(user, userCode)).status).toBe(200)
    ctx.clock.advance(5000)
    // A HEAD's answer has no body: had it delivered the key, no one would ever see it.
    const head = await ctx.app.handle(new Request(`http://test.local/v1/auth/device-codes/${deviceCode}`, { method: 'HEAD' }))
    expect(head.status).toBe(200)
    expect(await head.text()).toBe('')
    const [none] = await ctx.deps.sql`select count(*)::int as n from api_keys where user_id = ${user.id}`
    expect(none).toEqual({ n: 0 })

    // At once: the HEAD was no poll that the next must wait 5 s after.
    const delivered = await poll(deviceCode)
    expect(delivered.status).toBe(200)
    expect(delivered.body.data).toEqual({ status: 'approved', apiKey: expect.stringMatching(/^sk_usr_/), user: expect.any(Object) })
    const unknown = await ctx.app.handle(new Request(`http://test.local/v1/auth/device-codes/${deviceCode}`, { method: 'HEAD' }))
    expect(unknown.status).toBe(404)
  })

  test('an explicit {action: "approve"} approves', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await decide(user, userCode, { action: 'approve' })).body.data).toEqual({ status: 'approved' })
    expect((await poll(deviceCode)).body.data.status).toBe('approved')
  })

  test('an empty JSON body approves as no body does, however it comes: with a length of 0, chunked, or in process', async () => {
    // Clients that stream a body send an empty one chunked: Elysia read its nothing as JSON (400 invalid_json).
    const server = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: request => ctx.app.handle(request) })
    const onTheWire = (path: string, token: string, framing: string, body: string) =>
      new Promise<string>((resolve, reject) => {
        const head = `PATCH ${path} HTTP/1.1\r\nHost: test.local\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\n`
        const socket = connect(server.port!, '127.0.0.1', () => socket.write(`${head}${framing}Connection: close\r\n\r\n${body}`))
        let answer = ''
        socket.on('data', chunk => (answer += chunk.toString()))
        socket.on('end', () => resolve(answer))
        socket.on('error', reject)
      })
    try {
      for (const [framing, body] of [
        ['Content-Length: 0\r\n', ''],
        ['Transfer-Encoding: chunked\r\n', '0\r\n\r\n'],
      ]) {
        const user = await signUp(ctx)
        const { deviceCode, userCode } = await start()
        const answer = await onTheWire(`/v1/auth/device-codes/${userCode}`, user.token, framing!, body!)
        expect(answer.split('\r\n')[0]).toBe('HTTP/1.1 200 OK')
        expect(answer.slice(answer.indexOf('\r\n\r\n') + 4)).toBe(JSON.stringify({ success: true, data: { status: 'approved' } }))
        expect((await poll(deviceCode)).body.data.status).toBe('approved')
      }
    } finally {
      await server.stop(true)
    }
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    const inProcess = await ctx.call('PATCH', `/v1/auth/device-codes/${userCode}`, { token: user.token, rawBody: '' })
    expect(inProcess.body).toEqual({ success: true, data: { status: 'approved' } })
    expect((await poll(deviceCode)).body.data.status).toBe('approved')
  })

  test('an API key of the user can approve too', async () => {
    const user = await signUp(ctx)
    const created = await ctx.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name: 'cli' } })
    const { deviceCode, userCode } = await start()
    const res = await ctx.call('PATCH', `/v1/auth/device-codes/${userCode}`, { token: created.body.data.key })
    expect(res.status).toBe(200)
    expect((await poll(deviceCode)).body.data.user.id).toBe(user.id)
  })

  test('deny makes the device see denied, and the code cannot then be approved', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    const denied = await decide(user, userCode, { action: 'deny' })
    expect(denied.status).toBe(200)
    expect(denied.body.data).toEqual({ status: 'denied' })
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'denied' })
    expectError(await decide(user, userCode), 404, 'not_found')
    expect((await pollLater(deviceCode)).body.data).toEqual({ status: 'denied' })
    const [row] = await ctx.deps.sql`select count(*)::int as n from api_keys where user_id = ${user.id}`
    expect(row).toEqual({ n: 0 })
  })

  test('an unknown or malformed user code is 404 not_found', async () => {
    const user = await signUp(ctx)
    // well-formed but never issued here (a random code matches it with odds of 1 in 20^8)
    expectError(await decide(user, 'BBBB-BBBB'), 404, 'not_found')
    expectError(await decide(user, 'AEIO-U123'), 404, 'not_found')
    expectError(await decide(user, 'x'), 404, 'not_found')
  })

  test('an agent key is 403, no credential is 401, a bad action or unknown field is 400; none decide', async () => {
    const owner = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const { deviceCode, userCode } = await start()
    const path = `/v1/auth/device-codes/${userCode}`
    expectError(await ctx.call('PATCH', path, { apiKey: agent.apiKey }), 403, 'forbidden')
    expectError(await ctx.call('PATCH', path, { token: agent.apiKey }), 403, 'forbidden')
    const none = await ctx.call('PATCH', path)
    expectError(none, 401, 'unauthorized')
    expect(none.headers.get('www-authenticate') ?? '').toStartWith('Bearer')
    expectError(await decide(owner, userCode, { action: 'allow' }), 400, 'validation_failed')
    expectError(await decide(owner, userCode, { action: 'approve', scope: 'all' }), 400, 'validation_failed')
    expectError(await decide(owner, userCode, 'approve'), 400, 'validation_failed')
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'pending' })
  })
})

describe('delivery under concurrency', () => {
  test('20 parallel polls of an approved code deliver the key exactly once', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'pending' })
    expect((await decide(user, userCode)).status).toBe(200)
    ctx.clock.advance(5000)

    const results = await Promise.all(Array.from({ length: 20 }, () => poll(deviceCode)))
    const delivered = results.filter(r => r.status === 200)
    expect(delivered).toHaveLength(1)
    expect(delivered[0]!.body.data.status).toBe('approved')
    for (const res of results) {
      if (res.status === 200) continue
      expectError(res, res.status, res.status === 404 ? 'not_found' : 'slow_down')
      expect([404, 429]).toContain(res.status)
    }
    const [row] = await ctx.deps.sql`select count(*)::int as n from api_keys where user_id = ${user.id}`
    expect(row).toEqual({ n: 1 })
  })

  test('instances that do not share the poll gate still deliver the key exactly once', async () => {
    // Separate Redis prefixes give each instance its own slow_down gate, so the database alone must
    // make delivery happen once.
    const others = await Promise.all(Array.from({ length: 3 }, () => createTestContext({ database: ctx.database })))
    try {
      const user = await signUp(ctx)
      const { deviceCode, userCode } = await start()
      expect((await decide(user, userCode)).status).toBe(200)
      const instances = [ctx, ...others]
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => poll(deviceCode, instances[i % 4])))
      expect(results.filter(r => r.status === 200)).toHaveLength(1)
      expect(results.filter(r => r.status === 404).length).toBeGreaterThanOrEqual(3)
      for (const res of results) if (res.status !== 200) expectError(res, res.status, res.status === 404 ? 'not_found' : 'slow_down')
      const [row] = await ctx.deps.sql`select count(*)::int as n from api_keys where user_id = ${user.id}`
      expect(row).toEqual({ n: 1 })
    } finally {
      await Promise.all(others.map(other => other.close()))
    }
  })
})

/** The keys under a test's Redis prefix, without it, sorted. */
async function redisKeys(c: TestContext): Promise<string[]> {
  const found = await c.deps.redis.keys(`${c.config.redisPrefix}*`)
  return found.map(key => key.slice(c.config.redisPrefix.length)).sort()
}

describe('polls of codes that do not exist', () => {
  test('500 polls of random codes write nothing to Postgres or Redis but the address’s one bucket', async () => {
    const c = await createTestContext({ relay: false })
    try {
      const [before] = await c.deps.sql`select count(*)::int as n from device_codes`
      // Each queue writes its meta hash once connected, on its own time: not the polls' doing.
      await until(async () => (await Promise.all(c.deps.queues.all.map(q => c.deps.redis.exists(q.keys.meta!)))).every(n => n === 1))
      const keysBefore = await redisKeys(c)
      const results = await Promise.all(Array.from({ length: 500 }, () => poll(crypto.randomUUID(), c)))
      for (const res of results) expectError(res, 404, 'not_found')
      expect((await redisKeys(c)).filter(key => !keysBefore.includes(key))).toEqual(['rl:deviceCodePoll:ip:local'])
      const [after] = await c.deps.sql`select count(*)::int as n from device_codes`
      expect(after).toEqual(before)
    } finally {
      await c.close()
    }
  })

  test('a poll of a code that exists is still gated: polling it again at once is slow_down', async () => {
    const { deviceCode } = await start()
    expect((await poll(deviceCode)).status).toBe(200)
    expect(await ctx.deps.redis.exists(ctx.deps.keys.devicePoll(hashDeviceCode(deviceCode).toString('hex')))).toBe(1)
    expectError(await poll(deviceCode), 429, 'slow_down')
  })
})

describe('poll rate limit', () => {
  const limits = { RATE_LIMITS: rateLimits({ deviceCodePoll: { capacity: 3, perSeconds: 60 } }) }

  test('the 4th poll from one address within its bucket is 429 rate_limited with Retry-After, whatever code it names', async () => {
    const limited = await createTestContext({ env: limits })
    try {
      const real = await start(limited)
      for (let i = 0; i < 2; i++) expectError(await poll(crypto.randomUUID(), limited), 404, 'not_found')
      expect((await poll(real.deviceCode, limited)).body.data).toEqual({ status: 'pending' })
      limited.clock.advance(5000)
      const refused = await poll(real.deviceCode, limited)
      expectError(refused, 429, 'rate_limited')
      const seconds = expectRetryAfter(refused)
      expect(seconds).toBeLessThanOrEqual(20)
      expectError(await poll(crypto.randomUUID(), limited), 429, 'rate_limited')
      limited.clock.advance(seconds * 1000)
      expect((await poll(real.deviceCode, limited)).body.data).toEqual({ status: 'pending' })
    } finally {
      await limited.close()
    }
  })

  test('behind a trusted proxy each client address has its own bucket; the header is not believed from others', async () => {
    const limited = await createTestContext({ env: { ...limits, TRUSTED_PROXIES: '127.0.0.1' } })
    const server = limited.app.listen({ port: 0, hostname: '127.0.0.1' })
    const get = (forwardedFor: string) =>
      fetch(`http://127.0.0.1:${server.server!.port}/v1/auth/device-codes/${crypto.randomUUID()}`, {
        headers: { 'x-forwarded-for': forwardedFor },
      }).then(res => res.status)
    try {
      for (let i = 0; i < 3; i++) expect(await get('203.0.113.5')).toBe(404)
      expect(await get('203.0.113.5')).toBe(429)
      // What the client wrote itself is to the left of what the proxy appended: not a new bucket.
      expect(await get('198.51.100.1, 203.0.113.5')).toBe(429)
      expect(await get('203.0.113.6')).toBe(404)
    } finally {
      await server.stop()
      await limited.close()
    }
  })
})

describe('approval misses', () => {
  let limited: TestContext

  beforeAll(async () => {
    limited = await createTestContext({ env: { RATE_LIMITS: rateLimits({ deviceCodeMisses: { capacity: 10, perSeconds: 3600 } }) } })
  })
  afterAll(() => limited.close())

  test('after 10 misses in an hour a user is refused with 429 rate_limited, even for a real code; others are not', async () => {
    const guesser = await signUp(limited)
    const other = await signUp(limited)
    const real = await start(limited)
    for (let i = 0; i < 10; i++) {
      expectError(await decide(guesser, 'BBBB-BBBB', undefined, limited), 404, 'not_found')
    }
    const refused = await decide(guesser, real.userCode, undefined, limited)
    expectError(refused, 429, 'rate_limited')
    expectRetryAfter(refused)
    expect((await poll(real.deviceCode, limited)).body.data).toEqual({ status: 'pending' })

    const approved = await decide(other, real.userCode, undefined, limited)
    expect(approved.status).toBe(200)
    expect((await pollLater(real.deviceCode, limited)).body.data.user.id).toBe(other.id)
  })

  test('approvals of one code at once succeed as one; those past the budget in flight are told to retry; none costs a miss', async () => {
    const user = await signUp(limited)
    const { deviceCode, userCode } = await start(limited)
    // Each click is charged a miss until it is known to be a hit, so no more than the budget (10) are looked at
    // together. Clicks sent at once do not reach the budget at once (a loaded machine spreads them out), and a
    // later one may come after an earlier one was done and gave its miss back: then both are rightly let through.
    // So the code's row is locked meanwhile, and those let through stay in flight, waiting for it.
    const locker = createSql(limited.database.url, { max: 1 })
    const lock = await locker.reserve()
    const sent: Promise<CallResult>[] = []
    let answered = 0
    const send = (n: number) => {
      for (let i = 0; i < n; i++) sent.push(decide(user, userCode, undefined, limited).finally(() => answered++))
    }
    // False when they never are: more than the budget were let through, and the counts below say how many.
    const answeredBy = (n: number) =>
      until(async () => answered >= n, 10_000).then(
        () => true,
        () => false,
      )
    let clicks: CallResult[]
    try {
      await lock`begin`
      await lock`select 1 from device_codes where device_code_hash = ${hashDeviceCode(deviceCode)} for update`
      // 20 at once: 10 are let through and wait for the row, 10 are told to retry.
      send(20)
      // While those 10 are in flight, 10 more are all told to retry.
      if (await answeredBy(10)) {
        send(10)
        await answeredBy(20)
      }
      await lock`rollback`
      clicks = await Promise.all(sent)
    } finally {
      lock.release()
      await locker.end()
    }
    const approved = clicks.filter(click => click.status === 200)
    expect(approved.length).toBe(10)
    expect(approved.every(click => click.body.data.status === 'approved')).toBe(true)
    for (const click of clicks) {
      if (click.status === 200) continue
      expectError(click, 429, 'rate_limited')
      expectRetryAfter(click)
    }
    expect((await decide(user, userCode, undefined, limited)).body.data).toEqual({ status: 'approved' })
    expect((await pollLater(deviceCode, limited)).body.data.user.id).toBe(user.id)
    // None of them was a miss: the next code is approved, not refused.
    const next = await start(limited)
    expect((await decide(user, next.userCode, undefined, limited)).status).toBe(200)
    // Another user's click on a code this user approved is still a 404.
    const other = await signUp(limited)
    const third = await start(limited)
    expect((await decide(user, third.userCode, undefined, limited)).status).toBe(200)
    expectError(await decide(other, third.userCode, undefined, limited), 404, 'not_found')
    // Every hit gave back what it was charged: the whole budget of misses is left.
    for (let i = 0; i < 10; i++) expectError(await decide(user, 'BBBB-BBBB', undefined, limited), 404, 'not_found')
    expectError(await decide(user, 'BBBB-BBBB', undefined, limited), 429, 'rate_limited')
  }, 20_000)

  test('fifty guesses at once spend the miss budget before they are looked at: at most 10 are tried', async () => {
    const user = await signUp(limited)
    // A user key: the cache answers for it at once, so all fifty reach the budget together.
    const key = await limited.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name: 'guesser' } })
    const guesser = { ...user, token: key.body.data.key as string }
    // 45 wrong codes, then 5 real ones: a guess that is looked at is a 404 (a miss) or a 200 (a hit).
    const real = await Promise.all(Array.from({ length: 5 }, () => start(limited)))
    const wrong = Array.from({ length: 45 }, (_, i) => `BBBB-${'BCDFGHJKLMNPQRSTVWXZ'[i % 20]}${'BCDF'[Math.floor(i / 20)]}BB`)
    const results = await Promise.all([...wrong, ...real.map(r => r.userCode)].map(code => decide(guesser, code, undefined, limited)))
    const tried = results.filter(res => res.status === 404 || res.status === 200)
    expect(tried.length).toBeLessThanOrEqual(10)
    expect(results.filter(res => res.status === 404).length).toBeGreaterThanOrEqual(5)
    for (const res of results) {
      if (res.status === 404 || res.status === 200) continue
      expectError(res, 429, 'rate_limited')
      expectRetryAfter(res)
    }
    // A real code refused was not approved: it is still pending.
    for (const [i, { deviceCode }] of real.entries()) {
      if (results[45 + i]!.status === 429) expect((await poll(deviceCode, limited)).body.data).toEqual({ status: 'pending' })
    }
    expectError(await decide(guesser, 'BBBB-BBBB', undefined, limited), 429, 'rate_limited')
  })

  test('a hit gives back the miss it was charged: 10 misses after any number of hits are still 404', async () => {
    const user = await signUp(limited)
    for (let i = 0; i < 5; i++) {
      const { userCode } = await start(limited)
      expect((await decide(user, userCode, undefined, limited)).status).toBe(200)
    }
    for (let i = 0; i < 10; i++) expectError(await decide(user, 'BBBB-BBBB', undefined, limited), 404, 'not_found')
    expectError(await decide(user, 'BBBB-BBBB', undefined, limited), 429, 'rate_limited')
  })

  test('approvals that succeed are not misses', async () => {
    const user = await signUp(limited)
    for (let i = 0; i < 12; i++) {
      const { userCode } = await start(limited)
      expect((await decide(user, userCode, undefined, limited)).status).toBe(200)
    }
  })
})

describe('creation rate limit', () => {
  let limited: TestContext

  beforeAll(async () => {
    limited = await createTestContext({ env: { RATE_LIMITS: rateLimits({ deviceCodeCreate: { capacity: 3, perSeconds: 3600 } }) } })
  })
  afterAll(() => limited.close())

  test('the 4th start from one address is 429 rate_limited with a Retry-After that is honest', async () => {
    for (let i = 0; i < 3; i++) expect((await limited.call('POST', '/v1/auth/device-codes')).status).toBe(201)
    const refused = await limited.call('POST', '/v1/auth/device-codes')
    expectError(refused, 429, 'rate_limited')
    const seconds = expectRetryAfter(refused)
    expect(seconds).toBeLessThanOrEqual(1200)
    limited.clock.advance(seconds * 1000)
    expect((await limited.call('POST', '/v1/auth/device-codes')).status).toBe(201)
  })
})

describe('creation rate limit behind a load balancer', () => {
  const limits = { RATE_LIMITS: rateLimits({ deviceCodeCreate: { capacity: 2, perSeconds: 3600 } }) }
  /** Starts device authorizations over a real socket from 127.0.0.1, as a proxy there would. */
  const listening = async (env: Record<string, string>) => {
    const c = await createTestContext({ env: { ...limits, ...env } })
    const server = c.app.listen({ port: 0, hostname: '127.0.0.1' })
    const post = (forwardedFor: string) =>
      fetch(`http://127.0.0.1:${server.server!.port}/v1/auth/device-codes`, { method: 'POST', headers: { 'x-forwarded-for': forwardedFor } })
    return { post, close: async () => (await server.stop(), await c.close()) }
  }

  test('with TRUSTED_PROXIES each client behind the proxy has its own bucket', async () => {
    const { post, close } = await listening({ TRUSTED_PROXIES: '127.0.0.1' })
    try {
      expect((await post('203.0.113.5')).status).toBe(201)
      // A client cannot pick its own bucket by writing the header itself: the proxy's entry is last.
      expect((await post('198.51.100.77, 203.0.113.5')).status).toBe(201)
      const refused = await post('203.0.113.5')
      expect(refused.status).toBe(429)
      expect(((await refused.json()) as { error: string }).error).toBe('rate_limited')
      expect((await post('203.0.113.6')).status).toBe(201)
      // Addresses of one IPv6 network (/64) are one client: a host may take any of them.
      expect((await post('2001:db8:1:2::a')).status).toBe(201)
      expect((await post('2001:db8:1:2::b')).status).toBe(201)
      expect((await post('2001:db8:1:2:ffff::c')).status).toBe(429)
      expect((await post('2001:db8:1:3::a')).status).toBe(201)
    } finally {
      await close()
    }
  })

  test('without it the header is not believed: every request counts against the socket address', async () => {
    const { post, close } = await listening({})
    try {
      expect((await post('203.0.113.5')).status).toBe(201)
      expect((await post('203.0.113.6')).status).toBe(201)
      expect((await post('203.0.113.7')).status).toBe(429)
    } finally {
      await close()
    }
  })
})

/** The tables of the database whose rows, written as text, hold `needle`, with how many such rows each. */
async function tablesHolding(sql: Sql, needle: string): Promise<Record<string, number>> {
  const tables = await sql<{ name: string }[]>`select tablename as name from pg_tables where schemaname = 'public'`
  const found: Record<string, number> = {}
  for (const { name } of tables) {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from ${sql(name)} t where strpos(t::text, ${needle}) > 0`
    if (row!.n > 0) found[name] = row!.n
  }
  return found
}

/** Every key under a test's Redis prefix, with what it holds as text (names, members, fields and values). */
async function redisDump(c: TestContext): Promise<string> {
  const { redis } = c.deps
  const out: string[] = []
  for (const key of await redis.keys(`${c.config.redisPrefix}*`)) {
    const type = await redis.type(key)
    const value =
      type === 'string'
        ? await redis.get(key)
        : type === 'hash'
          ? await redis.hgetall(key)
          : type === 'list'
            ? await redis.lrange(key, 0, -1)
            : type === 'set'
              ? await redis.smembers(key)
              : type === 'zset'
                ? await redis.zrange(key, 0, -1)
                : type === 'stream'
                  ? await redis.xrange(key, '-', '+')
                  : null
    out.push(key, JSON.stringify(value))
  }
  return out.join('\n')
}

describe('device codes at rest', () => {
  test('neither Postgres nor Redis holds a device code after a start, a poll and an approval; the device still gets its key', async () => {
    const user = await signUp(ctx)
    const { deviceCode, userCode } = await start()
    expect((await poll(deviceCode)).body.data).toEqual({ status: 'pending' })
    expect((await decide(user, userCode)).status).toBe(200)
    // Approved and not yet collected: the moment a code read from storage would be worth a key.
    // As written (lower case, hyphens), and as hex without them (a uuid kept as bytes reads so).
    for (const spelling of [deviceCode, deviceCode.replace(/-/g, '')]) {
      expect(await tablesHolding(ctx.deps.sql, spelling)).toEqual({})
      expect(await redisDump(ctx)).not.toContain(spelling)
    }
    // The previous release's lookup (by device_code) finds nothing to deliver.
    expect(await ctx.deps.sql`select 1 from device_codes where device_code = ${deviceCode}`).toHaveLength(0)

    const delivered = await pollLater(deviceCode)
    expect(delivered.body.data).toMatchObject({ status: 'approved', user: { id: user.id } })
    expect((await ctx.call('GET', '/v1/auth/me', { token: delivered.body.data.apiKey })).body.data.id).toBe(user.id)
    expectError(await pollLater(deviceCode), 404, 'not_found')
  })
})

describe('device codes from before their hashing (migration 00023)', () => {
  const hashing = readMigrations().find(file => file.name === '00023_device_codes_by_hash.sql')!

  /** Starts an authorization as the previous release does: the code is the column's default, returned. */
  async function startAsBefore(sql: Sql, userCode: string): Promise<string> {
    const now = new Date()
    const [row] = await sql<{ deviceCode: string }[]>`
      insert into device_codes (user_code, created_at, expires_at)
      values (${userCode}, ${now}, ${new Date(now.getTime() + 900_000)})
      returning device_code as "deviceCode"`
    return row!.deviceCode
  }

  test('a code pending as the migration runs, and one the previous release starts after it, are polled and approved', async () => {
    const database = await createTestDatabase({ empty: true })
    const sql = createSql(database.url, { max: 1 })
    let c: TestContext | undefined
    try {
      await migrate(
        sql,
        readMigrations().filter(file => file.id < hashing.id),
      )
      const pendingBefore = await startAsBefore(sql, 'BBBBCCCC')
      expect(await migrate(sql)).toContain(hashing.name)
      // Converted in place: the code is no longer there as it was handed out.
      expect(await tablesHolding(sql, pendingBefore)).toEqual({})
      // A process of the previous release still serving (a rolling deploy, a rollback) starts one.
      const startedAfter = await startAsBefore(sql, 'DDDDFFFF')

      c = await createTestContext({ database })
      const user = await signUp(c)
      for (const [deviceCode, userCode] of [
        [pendingBefore, 'BBBB-CCCC'],
        [startedAfter, 'DDDD-FFFF'],
      ] as const) {
        expect((await poll(deviceCode, c)).body.data).toEqual({ status: 'pending' })
        expect((await decide(user, userCode, undefined, c)).status).toBe(200)
        const delivered = await pollLater(deviceCode, c)
        expect(delivered.body.data).toMatchObject({ status: 'approved', user: { id: user.id } })
        expect((await c.call('GET', '/v1/auth/me', { token: delivered.body.data.apiKey })).body.data.id).toBe(user.id)
        expectError(await pollLater(deviceCode, c), 404, 'not_found')
      }
    } finally {
      await c?.close()
      await sql.end()
      await database.drop()
    }
  })
})
