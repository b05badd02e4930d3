import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, signUp, subscribedPair, type TestContext, type TestUser } from './helpers/context.ts'
import { holdOpen } from './helpers/held-transaction.ts'
import { lockWaited } from './helpers/deactivation.ts'
import { createInboxReader } from '../src/conversations/inbox-reader.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let alice: TestUser
let bob: TestUser

beforeAll(async () => {
  // The actor runtime runs for the messages and service requests the inbox test sends.
  ctx = await createTestContext({ actors: true })
  alice = await signUp(ctx, 'alice')
  bob = await signUp(ctx, 'bob')
})
afterAll(() => ctx.close())

describe('registering an agent', () => {
  test('returns 201 with the participant, default settings and a one-time sk_agt_ key', async () => {
    const res = await ctx.call('POST', '/v1/participants', {
      token: alice.token,
      body: { name: 'research-bot', displayName: 'Research Bot', description: 'Finds things' },
    })
    expect(res.status).toBe(201)
    expect(res.body.success).toBe(true)
    expect(res.body.data).toMatchObject({
      name: 'research-bot',
      displayName: 'Research Bot',
      description: 'Finds things',
      ownerId: alice.id,
      settings: { blogEnabled: false, blogAutoPublish: false },
      rating: { average: null, count: 0 },
      activeSubscribers: 0,
    })
    expect(res.body.data.apiKey).toMatch(/^sk_agt_[0-9A-Za-z]{38}$/)
    expect(res.body.data.createdAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/)
  })

  test('refuses a taken name with 409 name_taken', async () => {
    await createAgent(ctx, alice, 'taken-name')
    expectError(await ctx.call('POST', '/v1/participants', { token: bob.token, body: { name: 'taken-name' } }), 409, 'name_taken')
  })

  test.each(['ab', 'Upper', '-starts', 'ends-', 'has_underscore', 'a'.repeat(33)])(
    'refuses the name %p with 400 validation_failed and details',
    async name => {
      const body = expectError(await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name } }), 400, 'validation_failed')
      expect(body.details[0].path).toBe('/name')
    },
  )

  test('refuses unknown fields, no credential and an agent key', async () => {
    expectError(await ctx.call('POST', '/v1/participants', { token: alice.token, body: { name: 'okay-name', extra: 1 } }), 400, 'validation_failed')
    const none = expectError(await ctx.call('POST', '/v1/participants', { body: { name: 'okay-name' } }), 401, 'unauthorized')
    expect(none).toBeTruthy()
    const agent = await createAgent(ctx, alice)
    expectError(await ctx.call('POST', '/v1/participants', { apiKey: agent.apiKey, body: { name: 'okay-name' } }), 403, 'forbidden')
  })
})

describe('registration budget', () => {
  test('fifty registrations at once by one user under the default 20 an hour: exactly 20 agents, the rest 429 with Retry-After', async () => {
    // The default rule, as a deployment has it (the test helper's limits are generous).
    const limited = await createTestContext({ env: { RATE_LIMITS: JSON.stringify({ apiKeyCreate: { capacity: 100, perSeconds: 1 } }) } })
    try {
      expect(limited.config.rateLimits.participantCreate).toEqual({ capacity: 20, perSeconds: 3600 })
      const user = await signUp(limited)
      // A user key: answered from the cache at once, so all fifty reach the budget together.
      const key = (await limited.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name: 'burst' } })).body.data.key as string
      const results = await Promise.all(
        Array.from({ length: 50 }, (_, i) =>
          limited.call('POST', '/v1/participants', { token: key, body: { name: `burst-${i}-${user.id.slice(0, 8)}` } }),
        ),
      )
      expect(results.filter(res => res.status === 201)).toHaveLength(20)
      for (const res of results) {
        if (res.status === 201) continue
        expectError(res, 429, 'rate_limited')
        expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      }
      const [row] = await limited.deps.sql`select count(*)::int as n from participants where owner_id = ${user.id}`
      expect(row).toEqual({ n: 20 })
      // Another user has a budget of their own.
      const other = await signUp(limited)
      expect((await limited.call('POST', '/v1/participants', { token: other.token, body: { name: `other-${other.id.slice(0, 8)}` } })).status).toBe(
        201,
      )
    } finally {
      await limited.close()
    }
  })
})

describe('reading agents', () => {
  test('is public by id or name, and shows settings to the owner only', async () => {
    const agent = await createAgent(ctx, alice)
    const byName = await ctx.call('GET', `/v1/participants/${agent.name}`)
    expect(byName.status).toBe(200)
    expect(byName.body.data.id).toBe(agent.id)
    expect(byName.body.data.settings).toBeUndefined()
    expect(byName.body.data.apiKey).toBeUndefined()
    const byOther = await ctx.call('GET', `/v1/participants/${agent.id}`, { token: bob.token })
    expect(byOther.body.data.settings).toBeUndefined()
    const byOwner = await ctx.call('GET', `/v1/participants/${agent.id}`, { token: alice.token })
    expect(byOwner.body.data.settings).toEqual({ blogEnabled: false, blogAutoPublish: false })
  })

  test('unknown agents are 404 and a bad credential on a public route is 401', async () => {
    expectError(await ctx.call('GET', '/v1/participants/no-such-agent'), 404, 'not_found')
    expectError(await ctx.call('GET', '/v1/participants/00000000-0000-4000-8000-000000000000'), 404, 'not_found')
    expectError(await ctx.call('GET', '/v1/participants/no-such-agent', { token: 'garbage' }), 401, 'invalid_token')
  })

  test('an id or name holding a NUL is 400 naming /id, not a database error without details', async () => {
    const refused = expectError(await ctx.call('GET', '/v1/participants/agent%00x'), 400, 'validation_failed')
    expect(refused.details).toEqual([{ path: '/id', message: expect.any(String) }])
  })

  test('lists only the caller’s own agents', async () => {
    const carol = await signUp(ctx)
    const one = await createAgent(ctx, carol)
    const two = await createAgent(ctx, carol)
    const res = await ctx.call('GET', '/v1/participants', { token: carol.token })
    expect(res.status).toBe(200)
    expect(res.body.data.map((p: { id: string }) => p.id)).toEqual([one.id, two.id])
    expectError(await ctx.call('GET', '/v1/participants'), 401, 'unauthorized')
  })
})

describe('changing an agent', () => {
  test('the owner updates profile and blog settings', async () => {
    const agent = await createAgent(ctx, alice)
    const res = await ctx.call('PATCH', `/v1/participants/${agent.id}`, {
      token: alice.token,
      body: { displayName: 'New Name', description: null, settings: { blogEnabled: true } },
    })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({
      displayName: 'New Name',
      description: null,
      settings: { blogEnabled: true, blogAutoPublish: false },
    })
  })

  test('unknown settings keys are 400; another user is 403; an unknown agent is 404', async () => {
    const agent = await createAgent(ctx, alice)
    const bad = expectError(
      await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { settings: { colour: 'red' } } }),
      400,
      'validation_failed',
    )
    expect(bad.details.length).toBeGreaterThan(0)
    expectError(await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: bob.token, body: { displayName: 'x' } }), 403, 'forbidden')
    expectError(await ctx.call('PATCH', '/v1/participants/00000000-0000-4000-8000-000000000000', { token: alice.token, body: {} }), 404, 'not_found')
    const unchanged = await ctx.call('GET', `/v1/participants/${agent.id}`, { token: alice.token })
    expect(unchanged.body.data.settings).toEqual({ blogEnabled: false, blogAutoPublish: false })
  })

  test('a deactivation committing while a PATCH waits for the row: 404, and the deactivated agent is left as it was', async () => {
    const agent = await createAgent(ctx, alice)
    // The deactivation's transaction, holding the row: the PATCH has found the agent active and waits to write.
    const release = await holdOpen(ctx.deps.sql, tx => tx`update participants set active = false where id = ${agent.id}`)
    const patched = ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Renamed' } })
    await until(
      async () =>
        (await ctx.deps.sql`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`)[0]!
          .n === 1,
    )
    await release()
    expectError(await patched, 404, 'not_found')
    const [row] = await ctx.deps.sql`select display_name as "displayName", active from participants where id = ${agent.id}`
    expect(row).toEqual({ displayName: agent.name, active: false })
  })

  test('rotating the key stops the old one at once', async () => {
    const agent = await createAgent(ctx, alice)
    expect((await ctx.call('GET', `/v1/participants/${agent.id}`, { apiKey: agent.apiKey })).status).toBe(200)
    expectError(await ctx.call('POST', `/v1/participants/${agent.id}/api-key`, { token: bob.token }), 403, 'forbidden')
    const rotated = await ctx.call('POST', `/v1/participants/${agent.id}/api-key`, { token: alice.token })
    expect(rotated.status).toBe(201)
    expect(rotated.body.data.apiKey).toMatch(/^sk_agt_/)
    expectError(await ctx.call('GET', `/v1/participants/${agent.id}`, { apiKey: agent.apiKey }), 401, 'invalid_token')
    expect((await ctx.call('GET', `/v1/participants/${agent.id}`, { apiKey: rotated.body.data.apiKey })).status).toBe(200)
  })

  test('deactivating keeps the data, stops the key and hides the agent', async () => {
    const agent = await createAgent(ctx, alice)
    expectError(await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: bob.token }), 403, 'forbidden')
    const res = await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: alice.token })
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ id: agent.id, active: false })
    expectError(await ctx.call('GET', `/v1/participants/${agent.id}`), 404, 'not_found')
    expectError(await ctx.call('GET', `/v1/participants/${agent.name}`, { apiKey: agent.apiKey }), 401, 'invalid_token')
    expectError(await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: alice.token }), 404, 'not_found')
    const [row] = await ctx.deps.sql`select active from participants where id = ${agent.id}`
    expect(row).toEqual({ active: false })
    expectError(await ctx.call('POST', '/v1/participants', { token: bob.token, body: { name: agent.name } }), 409, 'name_taken')
  })

  test('deactivating forgets the agent’s inbox in Redis: its pending and answered conversations and its open requests', async () => {
    const { agent, user, planId } = await subscribedPair(ctx, alice)
    const other = await signUp(ctx)
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId } })).status).toBe(201)
    const sender = await createAgent(ctx, bob)
    const message = (from: TestUser) => ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: from.token, body: { text: 'hi' } })
    expect((await message(user)).status).toBe(201)
    expect((await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).status).toBe(200)
    const reply = await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: 'hello' } })
    expect(reply.status).toBe(201)
    expect((await message(other)).status).toBe(201)
    const request = { targetAgentId: agent.id, input: 'do it' }
    expect((await ctx.call('POST', '/v1/agent/service-requests', { apiKey: sender.apiKey, body: request })).status).toBe(201)
    // The reply's event relayed (its inbox write made), so nothing writes to the inbox after the deactivation.
    await until(async () => (await ctx.deps.sql`select count(*)::int as n from outbox`)[0]!.n === 0)
    const k = ctx.deps.keys.agent(agent.id)
    const inboxKeys = [k.built, k.inbox, k.versions, k.requests]
    expect(await ctx.deps.redis.exists(...inboxKeys)).toBe(4)
    expect((await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: alice.token })).status).toBe(200)
    expect(await ctx.deps.redis.exists(...inboxKeys)).toBe(0)
  })

  test('a rebuild under way as the agent is deactivated writes nothing after the forgetting: no inbox stays in Redis for good', async () => {
    const { agent, user } = await subscribedPair(ctx, alice)
    expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hi' } })).status).toBe(201)
    const { redis, keys } = ctx.deps
    const k = keys.agent(agent.id)
    const inboxes = await createInboxReader(ctx.deps)
    // The rebuild holds the actor and has found the agent active, then waits to read its conversations.
    const unlock = await holdOpen(ctx.deps.sql, tx => tx`lock table conversations in access exclusive mode`)
    try {
      await redis.del(k.built)
      const reading = inboxes.read(agent.id).catch(() => null)
      await lockWaited(ctx.deps.sql)
      expect(await redis.exists(keys.actor(`agent:${agent.id}`).lease)).toBe(1)
      expect((await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: alice.token })).status).toBe(200)
      await unlock()
      await reading
      expect(await redis.exists(k.built, k.inbox, k.versions, k.requests)).toBe(0)
    } finally {
      await unlock().catch(() => {})
      await inboxes.close()
    }
  })
})
