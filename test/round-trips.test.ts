/**
 * Round trips to PostgreSQL and Redis on the hot paths: what each request's latency pays for when the
 * servers are far away (another zone or region: docs/operations.md, "Far from PostgreSQL and Redis").
 * Both servers sit behind proxies that count rounds (test/helpers/held-proxy.ts); each request is
 * made several times on a quiet service and its fewest rounds taken, so background traffic (probes,
 * timers) cannot add to the count. Checks a request makes that need not wait for each other are made
 * together, in one round.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createAgent, createTestContext, redisUrl, signUp, subscribedPair, userToken, type TestContext, type TestUser } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { roundCounter, startHeldProxy, type HeldProxy } from './helpers/held-proxy.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { meteredSubscriber } from './helpers/usage.ts'

const rounds = roundCounter()
const dashboard = 'https://app.example.com'
let postgres: HeldProxy
let redis: HeldProxy
let database: TestDatabase
let ctx: TestContext
let upstream: Upstream
let owner: TestUser

beforeAll(async () => {
  database = await createTestDatabase()
  postgres = await startHeldProxy(database.url, { rounds })
  redis = await startHeldProxy(redisUrl, { rounds })
  const url = new URL(database.url)
  url.port = new URL(postgres.url).port
  ctx = await createTestContext({
    database: { ...database, url: url.toString() },
    actors: true,
    relay: false,
    // A dashboard on another origin: its answers carry CORS headers, which cost no round.
    env: { REDIS_URL: redis.url, PROXY_ALLOWED_HOSTS: '127.0.0.1', CORS_ORIGINS: dashboard },
  })
  upstream = startUpstream()
  owner = await signUp(ctx)
  // A few milliseconds each way keep what is sent together apart from the answers, as far servers do.
  postgres.delay({ toServer: 3, toClient: 3 })
  redis.delay({ toServer: 3, toClient: 3 })
})
afterAll(async () => {
  upstream?.stop()
  await ctx?.close()
  await postgres?.close()
  await redis?.close()
  await database?.drop()
})

/** Runs `request` and counts its rounds, from its first send to its answer. */
async function counted(request: () => Promise<{ status: number }>): Promise<{ rounds: number; status: number }> {
  // Whatever was under way settles first.
  await Bun.sleep(20)
  rounds.lastWas = 'server'
  const before = rounds.count
  const { status } = await request()
  return { rounds: rounds.count - before, status }
}

/**
 * The fewest rounds of `times` requests made by `request(n)`, after `warm` more not counted (the
 * driver prepares each statement once per connection, at a round of its own, and the pools'
 * connections take turns), with every answer's status.
 */
async function fewest(request: (n: number) => Promise<{ status: number }>, times = 8, warm = 15) {
  const statuses: number[] = []
  let least = Infinity
  for (let n = 0; n < warm + times; n++) {
    const { rounds: r, status } = await counted(() => request(n))
    statuses.push(status)
    if (n >= warm) least = Math.min(least, r)
  }
  return { rounds: least, statuses: [...new Set(statuses)] }
}

const key = () => randomBytes(8).toString('hex')
const figures: Record<string, number> = {}

describe('round trips to PostgreSQL and Redis', () => {
  test('an agent’s poll: none when its inbox is in memory, one after it changed', async () => {
    const { agent, user } = await subscribedPair(ctx, owner)
    const poll = () => ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })
    const cached = await fewest(poll)
    let afterChange = Infinity
    for (let n = 0; n < 5; n++) {
      await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello' } })
      afterChange = Math.min(afterChange, (await counted(poll)).rounds)
    }
    figures['poll, inbox in memory'] = cached.rounds
    figures['poll, inbox changed'] = afterChange
    expect(cached).toEqual({ rounds: 0, statuses: [200] })
    expect(afterChange).toBe(1)
  }, 30_000)

  test('a user’s message through the agent’s actor checks the rate, then the agent and the subscription in one round', async () => {
    const { agent, user } = await subscribedPair(ctx, owner)
    const send = () =>
      ctx.call('POST', `/v1/conversations/${agent.id}/messages`, {
        token: user.token,
        body: { text: 'hello' },
        headers: { 'idempotency-key': key() },
      })
    const message = await fewest(send)
    figures['user message (actor)'] = message.rounds
    expect(message.statuses).toEqual([201])
    // The key's reservation; the rate (alone: a caller past it costs PostgreSQL nothing), then the
    // agent and the subscription together; the mailbox; the runtime's claim, hold, transaction (begin,
    // fence, the message with its owner, the event, applied, commit), projection and answer; the
    // key's outcome.
    expect(message.rounds).toBeLessThanOrEqual(16)
  }, 30_000)

  test('a message past its rate costs PostgreSQL nothing: the rate is checked first, alone', async () => {
    const limited = await createTestContext({
      database: ctx.database,
      actors: true,
      relay: false,
      env: {
        REDIS_URL: redis.url,
        REDIS_PREFIX: ctx.config.redisPrefix,
        RATE_LIMITS: JSON.stringify({ messagePost: { capacity: 1, perSeconds: 3600 } }),
      },
    })
    try {
      const { agent, user } = await subscribedPair(limited, owner)
      const send = () => limited.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'again' } })
      expect((await send()).status).toBe(201)
      // The fewest statements PostgreSQL was sent during one refused message (background reads only add).
      let least = Infinity
      for (let n = 0; n < 5; n++) {
        await Bun.sleep(20)
        postgres.resetTraffic()
        expect((await send()).status).toBe(429)
        least = Math.min(least, postgres.traffic().toServer)
      }
      expect(least).toBe(0)
    } finally {
      await limited.close()
    }
  }, 30_000)

  test('a dashboard’s preflight costs none: it is answered before any credential, rate or route', async () => {
    const headers = { origin: dashboard, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization' }
    const preflight = () => ctx.call('OPTIONS', '/v1/auth/sse-token', { headers })
    expect((await preflight()).headers.get('access-control-allow-origin')).toBe(dashboard)
    const answered = await fewest(preflight)
    figures['preflight'] = answered.rounds
    expect(answered).toEqual({ rounds: 0, statuses: [204] })
  }, 30_000)

  test('a service request checks the rate, then both agents in one round', async () => {
    const from = await createAgent(ctx, owner)
    const target = await createAgent(ctx, owner)
    const request = await fewest(() =>
      ctx.call('POST', '/v1/agent/service-requests', {
        apiKey: from.apiKey,
        body: { targetAgentId: target.id, input: 'work' },
        headers: { 'idempotency-key': key() },
      }),
    )
    figures['service request (actor)'] = request.rounds
    expect(request.statuses).toEqual([201])
    expect(request.rounds).toBeLessThanOrEqual(16)
  }, 30_000)

  test('a context write through the organization’s actor reads the newest version and the owner in one round', async () => {
    const { agent, user } = await subscribedPair(ctx, owner)
    const write = await fewest(n =>
      ctx.call('POST', '/v1/agent/context', {
        apiKey: agent.apiKey,
        body: { userId: user.id, type: 'brand', key: `key-${n}`, data: { tone: 'plain' } },
        headers: { 'idempotency-key': key() },
      }),
    )
    figures['context write (actor)'] = write.rounds
    expect(write.statuses).toEqual([201])
    // As a message, but the organization found (two statements) and the subscription checked again in the turn.
    expect(write.rounds).toBeLessThanOrEqual(18)
  }, 30_000)

  test('an agent’s reply', async () => {
    const { agent, user } = await subscribedPair(ctx, owner)
    let least = Infinity
    for (let n = 0; n < 10; n++) {
      await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello' } })
      const reply = await counted(() =>
        ctx.call('POST', '/v1/agent/conversation-reply', {
          apiKey: agent.apiKey,
          body: { userId: user.id, text: 'hi' },
          headers: { 'idempotency-key': key() },
        }),
      )
      expect(reply.status).toBe(201)
      if (n >= 5) least = Math.min(least, reply.rounds)
    }
    figures['agent reply'] = least
    // The key's reservation, the rate, the writer's statement, the inbox, the key's outcome.
    expect(least).toBeLessThanOrEqual(5)
  }, 30_000)

  test('a proxy call looks up the subscription and the connection in one round, and meters in fewer', async () => {
    const s = await meteredSubscriber(ctx, owner, upstream.url)
    const call = await fewest(() =>
      ctx.call('POST', '/v1/agent/proxy-call', {
        apiKey: s.agent.apiKey,
        body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
        headers: { 'idempotency-key': key() },
      }),
    )
    figures['proxy call'] = call.rounds
    expect(call.statuses).toEqual([200])
    // Reservation, rate, in flight, the lookups; then the period's usage (the period made first only
    // when new), the record, the job with the live count, the place in flight given back, the key's outcome.
    expect(call.rounds).toBeLessThanOrEqual(10)
  }, 30_000)

  test('a subscription, a first sign-in and a notification stream, for the record', async () => {
    const plan = (await meteredSubscriber(ctx, owner, upstream.url)).planId
    const users = await Promise.all(Array.from({ length: 23 }, () => signUp(ctx)))
    const subscribe = await fewest(n =>
      ctx.call('POST', '/v1/billing/subscriptions', { token: users[n]!.token, body: { planId: plan }, headers: { 'idempotency-key': key() } }),
    )
    expect(subscribe.statuses).toEqual([201])
    figures['subscription'] = subscribe.rounds
    const tokens = await Promise.all(Array.from({ length: 23 }, (_, n) => userToken(`rounds-${n}-${key()}`, { email: 'rounds@example.com' })))
    const signIn = await fewest(n => ctx.call('GET', '/v1/auth/me', { token: tokens[n]! }))
    expect(signIn.statuses).toEqual([200])
    figures['first sign-in'] = signIn.rounds
    // A user of its own for each stream: one may hold 5 at once.
    const stream = await fewest(async n => {
      const issued = await ctx.call('POST', '/v1/auth/sse-token', { token: users[n]!.token })
      const response = await ctx.app.handle(new Request(`http://test.local/v1/events/stream?token=${issued.body.data.token}`))
      await response.body!.getReader().read()
      await response.body!.cancel().catch(() => {})
      return response
    })
    expect(stream.statuses).toEqual([200])
    figures['stream token + stream open'] = stream.rounds
    console.log(`rounds: ${JSON.stringify(figures)}`)
  }, 60_000)
})
