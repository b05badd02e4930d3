/** What clients really send: odd characters, other spellings of times and ids, retries of a slow upstream. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import {
  createTestContext,
  expectError,
  halfAMillisecondAfter,
  idsBefore,
  signUp,
  subscribedPair,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { isInternal } from '../src/connections/address-policy.ts'

let ctx: TestContext
let upstream: Upstream
let owner: TestUser

beforeAll(async () => {
  ctx = await createTestContext({ actors: true, env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: randomBytes(32).toString('hex') } })
  upstream = startUpstream()
  owner = await signUp(ctx)
})
afterAll(async () => {
  upstream.stop()
  await ctx.close()
})

const subscribed = () => subscribedPair(ctx, owner)

describe('characters Postgres cannot store', () => {
  test('a NUL or an unpaired surrogate anywhere in a body is 400 at once, and the agent goes on working', async () => {
    const { agent, user } = await subscribed()
    const started = Date.now()
    const nul = expectError(
      await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'a\u0000b' } }),
      400,
      'validation_failed',
    )
    expect(nul.details[0].path).toBe('/text')
    expectError(
      await ctx.call('POST', '/v1/agent/context', {
        apiKey: agent.apiKey,
        body: { userId: user.id, type: 'custom', key: 'k', data: { note: '\ud800' } },
      }),
      400,
      'validation_failed',
    )
    const badKey = expectError(
      await ctx.call('PUT', '/v1/context/custom/k', { token: user.token, body: { data: { fine: 'yes', 'a\u0000': 1 } } }),
      400,
      'validation_failed',
    )
    expect(badKey.details[0].path).toBe('/data/a?')
    const inList = expectError(
      await ctx.call('PUT', '/v1/context/custom/k', { token: user.token, body: { data: { list: ['fine', { deeper: ['x', 'b\ud800'] }] } } }),
      400,
      'validation_failed',
    )
    expect(inList.details[0].path).toBe('/data/list/1/deeper/1')
    expect(Date.now() - started).toBeLessThan(2000)
    expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'fine 😀' } })).status).toBe(201)
  })
})

describe('lengths in characters', () => {
  test('a limit counts characters (code points), as the OpenAPI document’s maxLength and Postgres do, not UTF-16 units', async () => {
    const { user } = await subscribed()
    // 500 emoji are 1,000 UTF-16 units: within the 500 characters of a chat message.
    const chat = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: '😀'.repeat(500) } })
    expect(chat.status).toBe(201)
    const [stored] = await ctx.deps.sql<{ n: number }[]>`select char_length(text)::int as n from chat_messages where id = ${chat.body.data.id}`
    expect(stored!.n).toBe(500)
    const over = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: '😀'.repeat(501) } })
    expect(expectError(over, 400, 'validation_failed').details[0].path).toBe('/text')
    expect((await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: `${'a'.repeat(499)}😀` } })).status).toBe(201)
    expect((await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: `${'a'.repeat(500)}😀` } })).status).toBe(400)
  })

  test('a minimum counts characters too', async () => {
    // No route takes a minimum over 1, so the patched validator is asked directly (patches/README.md).
    const { TypeCompiler } = await import('@sinclair/typebox/compiler')
    const { Value } = await import('@sinclair/typebox/value')
    const { Type } = await import('@sinclair/typebox')
    const schema = Type.String({ minLength: 2, maxLength: 3 })
    const compiled = TypeCompiler.Compile(schema)
    for (const [text, valid] of [
      ['😀', false],
      ['😀😀', true],
      ['😀😀😀', true],
      ['😀😀😀😀', false],
      ['ab', true],
      ['a', false],
    ] as const) {
      expect([text, compiled.Check(text)]).toEqual([text, valid])
      expect([text, Value.Check(schema, text)]).toEqual([text, valid])
      expect([text, [...Value.Errors(schema, text)].length === 0]).toEqual([text, valid])
    }
  })
})

describe('bodies that are not JSON', () => {
  const put = (token: string, body: string | FormData, headers: Record<string, string> = {}) =>
    ctx.app.handle(
      new Request('http://test.local/v1/context/custom/not-json', { method: 'PUT', headers: { authorization: `Bearer ${token}`, ...headers }, body }),
    )
  const refusal = async (response: Response) => {
    const error = expectError({ status: response.status, headers: response.headers, body: await response.json() }, 415, 'unsupported_media_type')
    expect(error.message).toContain('Content-Type: application/json')
    return error
  }

  test('a file, a form, bytes, text or a body with no Content-Type are 415, and nothing is written', async () => {
    const { user } = await subscribed()
    const file = new FormData()
    file.append('data', new Blob(['{"a": 1}'], { type: 'application/json' }), 'data.json')
    // Form fields naming far-off array items are refused unread, not walked through billions of empty slots.
    const farOff = new FormData()
    farOff.append('data[4294967294]', 'x')
    for (const form of [file, farOff]) await refusal(await put(user.token, form))
    const data = JSON.stringify({ data: { a: 1 } })
    for (const type of [
      'application/octet-stream',
      'text/plain',
      'application/x-www-form-urlencoded',
      'application/jsonx',
      'application/merge-patch+json',
    ]) {
      await refusal(await put(user.token, data, { 'content-type': type }))
    }
    await refusal(await put(user.token, data))
    // A device decision so sent is refused before it could be read as none (which approves).
    const deny = JSON.stringify({ action: 'deny' })
    for (const headers of [{ 'content-type': 'application/octet-stream' }, {}] as Record<string, string>[]) {
      const response = await ctx.app.handle(
        new Request('http://test.local/v1/auth/device-codes/ABCD-EFGH', {
          method: 'PATCH',
          headers: { authorization: `Bearer ${user.token}`, ...headers },
          body: deny,
        }),
      )
      await refusal(response)
    }
    expect((await ctx.call('GET', '/v1/context?type=custom&key=not-json', { token: user.token })).body.data.entries).toEqual([])
  })
})

describe('bodies nested deep', () => {
  const nested = (depth: number, leaf: string) => '['.repeat(depth) + leaf + ']'.repeat(depth)

  test('thousands of levels are 400 naming the limit, on any route, and the process is fine', async () => {
    const { agent, user } = await subscribed()
    // The body object is a level too: 64 arrays in it make 65.
    for (const depth of [64, 5000, 200_000]) {
      const refused = expectError(
        await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, rawBody: `{"text":${nested(depth, '"x"')}}` }),
        400,
        'validation_failed',
      )
      expect(refused.details[0].message).toContain('64')
      // The pointer names where the limit was passed: the body, then 63 arrays in.
      expect(refused.details[0].path).toBe('/text' + '/0'.repeat(63))
    }
    expectError(
      await ctx.call('PUT', '/v1/context/custom/deep', { token: user.token, rawBody: `{"data":{"a":${nested(64, '1')}}}` }),
      400,
      'validation_failed',
    )
    expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'still here' } })).status).toBe(201)
  })

  test('up to 64 levels is stored as sent', async () => {
    const { user } = await subscribed()
    // The body object is level 1, data level 2, then 62 arrays: 64 in all.
    const data = { a: JSON.parse(nested(62, '1')) }
    const stored = await ctx.call('PUT', '/v1/context/custom/deep-enough', { token: user.token, body: { data } })
    expect(stored.status).toBe(200)
    expect(stored.body.data.data).toEqual(data)
    const read = await ctx.call('GET', '/v1/context?type=custom&key=deep-enough', { token: user.token })
    expect(read.body.data.entries[0].data).toEqual(data)
  })
})

describe('numbers past a 64-bit float', () => {
  test('are 400 naming where, and nothing is stored (JSON reads 1e400 as Infinity, which would be kept as null)', async () => {
    const { user } = await subscribed()
    for (const number of ['1e400', '-1e400']) {
      const refused = expectError(
        await ctx.call('PUT', '/v1/context/custom/huge', { token: user.token, rawBody: `{"data":{"a":[1, ${number}]}}` }),
        400,
        'validation_failed',
      )
      expect(refused.details[0].path).toBe('/data/a/1')
    }
    expect((await ctx.call('GET', '/v1/context?type=custom&key=huge', { token: user.token })).body.data.entries).toEqual([])
    const stored = await ctx.call('PUT', '/v1/context/custom/huge', { token: user.token, rawBody: '{"data":{"a":1.7e308}}' })
    expect(stored.status).toBe(200)
    expect(stored.body.data.data).toEqual({ a: 1.7e308 })
  })
})

describe('ids and times as clients write them', () => {
  test('an upper-case UUID is refused with 400 instead of reaching the wrong key', async () => {
    const { agent, user } = await subscribed()
    await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hi' } })
    expectError(
      await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id.toUpperCase(), text: 'hello' } }),
      400,
      'validation_failed',
    )
    const pending = (await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).body.data.pendingConversations
    expect(pending.length).toBe(1)
  })

  test('since without an offset is UTC; a space, a lower-case z and an empty value are understood; year 0 is 400', async () => {
    const { agent, user } = await subscribed()
    const sent = await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hi' } })
    const at = new Date(new Date(sent.body.data.createdAt).getTime() - 1000).toISOString()
    for (const since of [at.replace('Z', ''), at.replace('T', ' '), at.replace('Z', 'z'), at.replace('Z', '+00:00'), '']) {
      const res = await ctx.call('GET', `/v1/agent/events?since=${encodeURIComponent(since)}`, { apiKey: agent.apiKey })
      expect(res.status).toBe(200)
      expect(res.body.data.pendingConversations.length).toBe(1)
    }
    expectError(await ctx.call('GET', '/v1/billing/subscriptions?before=0000-01-01T00:00:00Z', { token: user.token }), 400, 'validation_failed')
    expectError(await ctx.call('GET', '/v1/billing/invoices?before=2026-02-30T00:00:00Z', { token: user.token }), 400, 'validation_failed')
  })

  test('before and since at the edges of ISO 8601: 24:00, a leap second, offsets (a + sent unencoded too), years 1 to 9999', async () => {
    const { agent, user, subscriptionId } = await subscribed()
    const sent = (await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hi' } })).body.data
    const lists: [string, { token?: string; apiKey?: string }][] = [
      ['/v1/billing/subscriptions', { token: user.token }],
      ['/v1/billing/invoices', { token: user.token }],
      [`/v1/billing/reviews/${agent.id}`, { token: user.token }],
      ['/v1/chat/messages', { token: user.token }],
      [`/blog/manage/${agent.id}`, { apiKey: agent.apiKey }],
      [`/v1/conversations/${agent.id}/messages`, { token: user.token }],
    ]
    // Raw in the URL: a `+` arrives as a space, read as the offset's `+` it stood for.
    const read = ['2026-11-22T24:00:00Z', '2026-11-22T10:00:00.0005%2B01:00', '2026-11-22T10:00:00.0005+01:00', '0001-01-01T00:00:00Z']
    const refused = ['2016-12-31T23:59:60Z', '2026-11-22T24:00:01Z', '0000-12-31T00:00:00Z', '10000-01-01T00:00:00Z', '9999-12-31T23:30:00-01:00']
    for (const [path, credential] of lists) {
      for (const before of [...read, '1969-12-31T23:59:59.9995Z', '9999-12-31T23:59:59.9999Z', '']) {
        expect((await ctx.call('GET', `${path}?before=${before}`, credential)).status, `${path} ${before}`).toBe(200)
      }
      for (const before of refused) expectError(await ctx.call('GET', `${path}?before=${before}`, credential), 400, 'validation_failed')
    }
    for (const since of read) expect((await ctx.call('GET', `/v1/agent/events?since=${since}`, { apiKey: agent.apiKey })).status, since).toBe(200)
    for (const since of refused)
      expectError(await ctx.call('GET', `/v1/agent/events?since=${since}`, { apiKey: agent.apiKey }), 400, 'validation_failed')

    // The subscription and the message, made now: each answer right, not merely not refused.
    const made = (await ctx.call('GET', '/v1/billing/subscriptions', { token: user.token })).body.data[0].createdAt as string
    const day = made.slice(0, 10)
    const subscriptions = (before: string) => ctx.call('GET', `/v1/billing/subscriptions?before=${before}`, { token: user.token })
    /** `at` as the clock one hour ahead of UTC shows it, with `finer` digits after its milliseconds. */
    const plusOneHour = (at: string, finer = '') => `${new Date(Date.parse(at) + 3_600_000).toISOString().slice(0, -1)}${finer}+01:00`
    for (const [before, listed] of [
      [`${day}T24:00:00Z`, true],
      [`${day}T00:00:00Z`, false],
      [plusOneHour(made, '5'), true],
      [plusOneHour(made), false],
      [encodeURIComponent(plusOneHour(made, '5')), true],
      ['0001-01-01T00:00:00Z', false],
      ['9999-12-31T23:59:59.9999Z', true],
      ['', true],
    ] as const) {
      expect(
        (await subscriptions(before)).body.data.map((s: { id: string }) => s.id),
        before,
      ).toEqual(listed ? [subscriptionId] : [])
    }
    const pending = async (since: string) =>
      (await ctx.call('GET', `/v1/agent/events?since=${since}`, { apiKey: agent.apiKey })).body.data.pendingConversations.length
    const justBefore = new Date(Date.parse(sent.createdAt) - 1).toISOString()
    expect(await pending(plusOneHour(justBefore, '5'))).toBe(1)
    expect(await pending(plusOneHour(sent.createdAt, '5'))).toBe(0)
  })

  test('unknown query parameters are ignored, as web APIs do', async () => {
    const { agent, user } = await subscribed()
    expect((await ctx.call('GET', '/v1/agent/events?utm_source=x&limit=100', { apiKey: agent.apiKey })).status).toBe(200)
    expect((await ctx.call('GET', '/v1/billing/subscriptions?page=2', { token: user.token })).status).toBe(200)
  })
})

describe('connected accounts and proxy calls', () => {
  test('IPv4-mapped IPv6 in any spelling and over-long encoded URLs are refused', async () => {
    for (const address of ['::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:a00:1', '::a00:1', '::ffff:c0a8:101']) {
      expect(isInternal(address)).toBe(true)
    }
    // A public IPv4 address written as IPv4-mapped IPv6 is refused too: the whole range is special (issue 24).
    expect(isInternal('::ffff:808:808')).toBe(true)
    const user = await signUp(ctx)
    for (const baseUrl of [
      'https://[::ffff:a00:1]:6443',
      'https://[::ffff:7f00:1]',
      `https://1.1.1.1/${'é'.repeat(400)}`,
      // 6to4, Teredo, site-local, discard-only, NAT64: each was accepted before issue 24
      'https://[2002:7f00:1::1]',
      'https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]',
      'https://[fec0::1]',
      'https://[100::1]',
      'https://[64:ff9b::a00:1]',
    ]) {
      expectError(
        await ctx.call('POST', '/v1/connections', { token: user.token, body: { provider: 'p', baseUrl, credential: 'x' } }),
        400,
        'validation_failed',
      )
    }
  })

  test('headers a header cannot carry, too many headers or query parameters, and unsendable credentials are 400, and reach no one', async () => {
    const { agent, user } = await subscribed()
    expect(
      (
        await ctx.call('POST', '/v1/connections', {
          token: user.token,
          body: { provider: 'plain', baseUrl: upstream.url, credential: 'tok-1.2_3~/+=' },
        })
      ).status,
    ).toBe(201)
    for (const credential of ['tok☃', 'tok\r\nX-Injected: 1', 'two words', '\u00e9t\u00e9']) {
      const refused = expectError(
        await ctx.call('POST', '/v1/connections', { token: user.token, body: { provider: 'bad', baseUrl: upstream.url, credential } }),
        400,
        'validation_failed',
      )
      expect(refused.details[0].path).toBe('/credential')
    }
    const call = (extra: Record<string, unknown>) =>
      ctx.call('POST', '/v1/agent/proxy-call', {
        apiKey: agent.apiKey,
        body: { userId: user.id, provider: 'plain', method: 'GET', path: '/echo', ...extra },
      })
    const before = upstream.received.length
    const many = (n: number, prefix: string) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`${prefix}${i}`, 'v']))
    for (const extra of [
      { headers: { 'x-test': '☃' } },
      { headers: { accept: '😀' } },
      { headers: { 'x-test': 'a\r\nx-injected: 1' } },
      { headers: many(51, 'x-h') },
      { headers: { [`x-${'a'.repeat(101)}`]: 'v' } },
      { query: many(101, 'q') },
    ]) {
      expectError(await call(extra), 400, 'validation_failed')
    }
    expect(upstream.received.length).toBe(before)
    const sent = await call({ headers: many(50, 'x-h'), query: many(100, 'q') })
    expect(sent.status).toBe(200)
    expect(upstream.received.length).toBe(before + 1)
  })

  test('a reservation left by a process that died mid-call is taken over once its 10 s lease lapsed, and metered once', async () => {
    const { agent, user } = await subscribed()
    await ctx.call('POST', '/v1/connections', { token: user.token, body: { provider: 'crashy', baseUrl: upstream.url, credential: 'x' } })
    const body = { userId: user.id, provider: 'crashy', method: 'GET', path: '/echo' }
    const headers = { 'idempotency-key': 'crash-1' }
    const call = () => ctx.call('POST', '/v1/agent/proxy-call', { apiKey: agent.apiKey, body, headers })
    const first = await call()
    expect(first.status).toBe(200)
    // What a process killed after reaching the upstream leaves: the reservation, and no outcome.
    const abandon = (secondsAgo: number) => ctx.deps.sql`
      update idempotency_keys set response_status = null, response_body = null,
        created_at = ${new Date(ctx.clock.now().getTime() - secondsAgo * 1000)}
      where key = 'crash-1'
    `
    await abandon(5)
    const before = upstream.received.length
    expectError(await call(), 409, 'idempotency_key_in_progress')
    expect(upstream.received.length).toBe(before)
    await abandon(11)
    const retried = await call()
    expect(retried.status).toBe(200)
    expect(upstream.received.length).toBe(before + 1)
    // The same usage event as the first attempt's: counted once.
    expect(retried.body.data.usage.periodCalls).toBe(first.body.data.usage.periodCalls)
    const again = await call()
    expect(again.body).toEqual(retried.body)
  })

  test('a retry of a proxy call that timed out at the upstream replays the 504 and never calls it again', async () => {
    const { agent, user } = await subscribed()
    await ctx.call('POST', '/v1/connections', { token: user.token, body: { provider: 'slow', baseUrl: upstream.url, credential: 'x' } })
    const body = { userId: user.id, provider: 'slow', method: 'GET', path: '/hang' }
    const headers = { 'idempotency-key': 'slow-1' }
    const before = upstream.received.length
    const first = ctx.call('POST', '/v1/agent/proxy-call', { apiKey: agent.apiKey, body, headers })
    await Bun.sleep(300)
    const repeat = await ctx.call('POST', '/v1/agent/proxy-call', { apiKey: agent.apiKey, body, headers })
    const meanwhile = expectError(repeat, 409, 'idempotency_key_in_progress')
    expect(meanwhile.message).toContain('in progress')
    expect(repeat.headers.get('retry-after')).toMatch(/^([1-9]|10)$/)
    expectError(await first, 504, 'upstream_timeout')
    expectError(await ctx.call('POST', '/v1/agent/proxy-call', { apiKey: agent.apiKey, body, headers }), 504, 'upstream_timeout')
    expect(upstream.received.length).toBe(before + 1)
  }, 30_000)
})

describe('smaller promises', () => {
  test('updating a review without a comment keeps it; null clears it', async () => {
    const { agent, user } = await subscribed()
    await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, rating: 5, comment: 'Great' } })
    const kept = await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, rating: 4 } })
    expect(kept.body.data).toMatchObject({ rating: 4, comment: 'Great' })
    const cleared = await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, rating: 4, comment: null } })
    expect(cleared.body.data.comment).toBeNull()
  })

  test('a wallet address can be cleared with null', async () => {
    const user = await signUp(ctx)
    await ctx.call('PATCH', '/v1/auth/me', { token: user.token, body: { walletAddress: '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed' } })
    const cleared = await ctx.call('PATCH', '/v1/auth/me', { token: user.token, body: { walletAddress: null } })
    expect(cleared.status).toBe(200)
    expect(cleared.body.data.walletAddress).toBeNull()
  })

  test('deactivating an agent ends its subscriptions; names of the blog’s own routes are taken', async () => {
    const { agent, user } = await subscribed()
    await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: owner.token })
    const subs = (await ctx.call('GET', '/v1/billing/subscriptions', { token: user.token })).body.data
    expect(subs[0]).toMatchObject({ participantId: agent.id, status: 'cancelled' })
    for (const name of ['posts', 'manage']) {
      expectError(await ctx.call('POST', '/v1/participants', { token: owner.token, body: { name } }), 409, 'name_taken')
    }
  })

  test('the device verification page says how to approve the code it was given', async () => {
    const res = await ctx.call('GET', '/device?user_code=BCDF-GHJK')
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toContain('text/html')
    expect(res.body).toContain('BCDF-GHJK')
    expect(res.body).toContain('/v1/auth/device-codes/BCDF-GHJK')
    const hostile = await ctx.call('GET', `/device?user_code=${encodeURIComponent('<b>x</b>')}`)
    expect(hostile.status).toBe(200)
    expect(hostile.body).not.toContain('<b>x')
    // A page for a browser: a code too long to be one is no JSON error either, only not shown.
    const long = await ctx.call('GET', `/device?user_code=${'B'.repeat(40)}`)
    expect(long.status).toBe(200)
    expect(long.headers.get('content-type')).toContain('text/html')
    expect(long.body).toContain('Enter the code your device shows')
  })

  test('an SSE token is issued with 200 and lasts 60 s', async () => {
    const user = await signUp(ctx)
    const res = await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })
    expect(res.status).toBe(200)
    expect(res.body.data.expiresIn).toBe(60)
  })

  test('world chat pages with before and honours Idempotency-Key', async () => {
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'chat-1' }
    const first = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'once' }, headers })
    const again = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'once' }, headers })
    expect(again.body).toEqual(first.body)
    ctx.clock.advance(10)
    const later = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'later' } })
    const older = await ctx.call('GET', `/v1/chat/messages?before=${encodeURIComponent(later.body.data.createdAt)}`, { token: user.token })
    expect(older.body.data.map((m: { text: string }) => m.text)).toContain('once')
    expect(older.body.data.map((m: { text: string }) => m.text)).not.toContain('later')
    const [row] = await ctx.deps.sql`select count(*)::int as n from chat_messages where text = 'once'`
    expect(row!.n).toBe(1)
  })

  test('a chat message is older than a `before` finer than a millisecond in its millisecond: listed, as it is not at its own time', async () => {
    const user = await signUp(ctx)
    const sent = (await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'finer' } })).body.data
    const [newest] = await idsBefore(ctx, '/v1/chat/messages', { token: user.token }, halfAMillisecondAfter(sent.createdAt))
    expect(newest).toBe(sent.id)
    expect(await idsBefore(ctx, '/v1/chat/messages', { token: user.token }, sent.createdAt)).not.toContain(sent.id)
  })
})
