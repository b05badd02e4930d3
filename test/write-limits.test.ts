/** Writes that leave something behind for good (or for a day) take a token of their rule: past it 429, nothing kept. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, signUp, subscribedPair, type TestContext, type TestUser } from './helpers/context.ts'
import { blogAgent, writePost } from './helpers/blog.ts'

const one = { capacity: 1, perSeconds: 3600 }
let ctx: TestContext

beforeAll(async () => {
  const rules = [
    'contextWrite',
    'connectionCreate',
    'planWrite',
    'configPurchase',
    'sseTokenCreate',
    'apiKeyCreate',
    'configWrite',
    'subscriptionCreate',
    'reviewWrite',
    'reactionWrite',
  ]
  ctx = await createTestContext({
    actors: true,
    env: { RATE_LIMITS: JSON.stringify(Object.fromEntries(rules.map(rule => [rule, one]))), PROXY_ALLOWED_HOSTS: '127.0.0.1' },
  })
})
afterAll(() => ctx.close())

const count = async (table: string, column: string, value: string) =>
  (await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from ${ctx.deps.sql(table)} where ${ctx.deps.sql(column)} = ${value}`)[0]!.n

/** Refused with 429 `rate_limited` and a Retry-After in seconds. */
function limited(res: Awaited<ReturnType<TestContext['call']>>) {
  expectError(res, 429, 'rate_limited')
  expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0)
}

describe('writes past their rule', () => {
  test('context versions: a user’s writes and reverts share contextWrite, an agent has its own', async () => {
    const owner = await signUp(ctx)
    const { agent, user } = await subscribedPair(ctx, owner)
    expect((await ctx.call('PUT', '/v1/context/tone/voice', { token: user.token, body: { data: { formal: true } } })).status).toBe(200)
    limited(await ctx.call('PUT', '/v1/context/tone/voice', { token: user.token, body: { data: { formal: false } } }))
    limited(await ctx.call('POST', '/v1/context/tone/voice/revert', { token: user.token, body: { version: 1 } }))
    const write = { userId: user.id, type: 'tone', key: 'pace', data: { fast: true } }
    expect((await ctx.call('POST', '/v1/agent/context', { apiKey: agent.apiKey, body: write })).status).toBe(201)
    limited(await ctx.call('POST', '/v1/agent/context', { apiKey: agent.apiKey, body: { ...write, key: 'other' } }))
    expect(await count('context_entries', 'key', 'voice')).toBe(1)
    expect(await count('context_entries', 'key', 'other')).toBe(0)
  })

  test('connected accounts, plans, key rotations and stream tokens', async () => {
    const user: TestUser = await signUp(ctx)
    const connection = { provider: 'acme', baseUrl: 'http://127.0.0.1:9', credential: 'secret' }
    expect((await ctx.call('POST', '/v1/connections', { token: user.token, body: connection })).status).toBe(201)
    limited(await ctx.call('POST', '/v1/connections', { token: user.token, body: { ...connection, provider: 'other' } }))
    expect(await count('connections', 'user_id', user.id)).toBe(1)

    const agent = await createAgent(ctx, user)
    const terms = { participantId: agent.id, name: 'Basic', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 }
    const plan = await ctx.call('POST', '/v1/billing/plans', { token: user.token, body: terms })
    expect(plan.status).toBe(201)
    limited(await ctx.call('PATCH', `/v1/billing/plans/${plan.body.data.id}`, { token: user.token, body: { monthlyPriceCents: 999 } }))
    limited(await ctx.call('POST', '/v1/billing/plans', { token: user.token, body: { ...terms, name: 'Second' } }))
    expect(
      (await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: user.token })).body.data.map(
        (p: { monthlyPriceCents: number }) => p.monthlyPriceCents,
      ),
    ).toEqual([100])

    expect((await ctx.call('POST', `/v1/participants/${agent.id}/api-key`, { token: user.token })).status).toBe(201)
    limited(await ctx.call('POST', `/v1/participants/${agent.id}/api-key`, { token: user.token }))

    expect((await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })).status).toBe(200)
    limited(await ctx.call('POST', '/v1/auth/sse-token', { token: user.token }))
  })

  test('config purchases, a repeat of one bought before too; a replay of a key is answered as before', async () => {
    const owner = await signUp(ctx)
    const buyer = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const listing = { participantId: agent.id, name: 'C', priceCents: 250, fileType: 'md', content: 'c'.repeat(1000) }
    const config = await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing })
    const buy = (key: string) =>
      ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: buyer.token, headers: { 'idempotency-key': key } })
    const first = await buy('first')
    expect(first.status).toBe(201)
    limited(await buy('second'))
    // A replay of the first is its stored answer, past the rule or not.
    const replay = await buy('first')
    expect([replay.status, replay.body]).toEqual([201, first.body])
    expect(await count('idempotency_keys', 'key', 'second')).toBe(0)
  })

  test('config listings: creations and changes share configWrite', async () => {
    const owner = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const listing = { participantId: agent.id, name: 'C', priceCents: 1, fileType: 'md', content: 'c'.repeat(1000) }
    const first = await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing })
    expect(first.status).toBe(201)
    limited(await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: { ...listing, name: 'D' } }))
    limited(await ctx.call('PATCH', `/v1/billing/configs/${first.body.data.id}`, { token: owner.token, body: { content: 'd'.repeat(1000) } }))
    expect(await count('config_listings', 'participant_id', agent.id)).toBe(1)
  })

  test('subscriptions: a user subscribing and cancelling in a loop is stopped; a replay of a key is answered as before', async () => {
    const owner = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const terms = { participantId: agent.id, name: 'Free', monthlyPriceCents: 0, includedProxyCalls: 0, overagePerCallCents: 0 }
    const plan = await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: terms })
    const user = await signUp(ctx)
    const subscribe = (key: string) =>
      ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id }, headers: { 'idempotency-key': key } })
    const first = await subscribe('first')
    expect(first.status).toBe(201)
    expect((await ctx.call('DELETE', `/v1/billing/subscriptions/${first.body.data.id}`, { token: user.token })).status).toBe(200)
    limited(await subscribe('second'))
    const replay = await subscribe('first')
    expect([replay.status, replay.body]).toEqual([201, first.body])
    expect(await count('subscriptions', 'user_id', user.id)).toBe(1)
    expect(await count('idempotency_keys', 'key', 'second')).toBe(0)
  })

  test('reviews: a customer rewriting a review in a loop is stopped; the agent’s rating stays', async () => {
    const owner = await signUp(ctx)
    const { agent, user } = await subscribedPair(ctx, owner)
    const review = (rating: number) => ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, rating } })
    expect((await review(5)).status).toBe(201)
    limited(await review(1))
    const reviews = await ctx.call('GET', `/v1/billing/reviews/${agent.id}`, { token: user.token })
    expect(reviews.body.data.map((r: { rating: number }) => r.rating)).toEqual([5])
    expect((await ctx.call('GET', `/v1/participants/${agent.id}`)).body.data.rating).toEqual({ average: 5, count: 1 })
  })

  test('user keys: approving device codes takes apiKeyCreate as creating keys does; a miss or a denial takes none', async () => {
    const user = await signUp(ctx)
    const start = async () => (await ctx.call('POST', '/v1/auth/device-codes')).body.data
    const decide = (userCode: string, action?: 'deny') =>
      ctx.call('PATCH', `/v1/auth/device-codes/${userCode}`, { token: user.token, ...(action ? { body: { action } } : {}) })
    expect((await decide('BBBB-BBBB')).status).toBe(404)
    expect((await decide((await start()).userCode, 'deny')).status).toBe(200)
    const first = await start()
    expect((await decide(first.userCode)).status).toBe(200)
    expect((await ctx.call('GET', `/v1/auth/device-codes/${first.deviceCode}`)).body.data.status).toBe('approved')
    const second = await start()
    limited(await decide(second.userCode))
    limited(await ctx.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name: 'more' } }))
    expect((await ctx.call('GET', `/v1/auth/device-codes/${second.deviceCode}`)).body.data.status).toBe('pending')
    expect(await count('api_keys', 'user_id', user.id)).toBe(1)
  })

  test('reactions: adding and taking back share reactionWrite, per reactor', async () => {
    const agent = await blogAgent(ctx, await signUp(ctx))
    const post = await writePost(ctx, agent, { title: 'Liked', publish: true })
    const user = await signUp(ctx)
    const react = (method: 'POST' | 'DELETE', type: string, credential: { token: string } | { apiKey: string } = { token: user.token }) =>
      ctx.call(method, `/blog/posts/${post.id}/reactions`, { ...credential, body: { type } })
    expect((await react('POST', 'like')).status).toBe(201)
    limited(await react('DELETE', 'like'))
    limited(await react('POST', 'helpful'))
    // Another reactor has a bucket of its own.
    expect((await react('POST', 'insightful', { apiKey: agent.apiKey })).status).toBe(201)
    expect((await ctx.call('GET', `/blog/posts/${post.id}/reactions`)).body.data).toEqual({ like: 1, insightful: 1, helpful: 0, total: 2 })
  })
})
