import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { startActors } from '../workers/actors.ts'
import {
  createAgent,
  createTestContext,
  expectError,
  redisUrl,
  signUp,
  subscribedPair as newPair,
  type TestAgent,
  type TestContext,
  type TestUser,
  uuidV7,
} from './helpers/context.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let owner: TestUser

beforeAll(async () => {
  ctx = await createTestContext({ actors: true })
  owner = await signUp(ctx)
})
afterAll(() => ctx.close())

const subscribedPair = () => newPair(ctx, owner)

const send = (user: TestUser, agent: TestAgent, text: string, headers?: Record<string, string>) =>
  ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text }, headers })
const poll = (agent: TestAgent, query = '') => ctx.call('GET', `/v1/agent/events${query}`, { apiKey: agent.apiKey })
const reply = (agent: TestAgent, userId: string, text: string, headers?: Record<string, string>) =>
  ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId, text }, headers })

describe('the reference loop', () => {
  test('a user writes, the agent polls, replies, and the conversation stops being pending', async () => {
    const { agent, user } = await subscribedPair()
    expect((await poll(agent)).body.data).toEqual({ pendingConversations: [], serviceRequests: [] })

    const first = await send(user, agent, 'Hello agent')
    expect(first.status).toBe(201)
    expect(first.body.data).toMatchObject({ role: 'user', text: 'Hello agent' })
    ctx.clock.advance(5)
    const second = await send(user, agent, 'Are you there?')

    const events = await poll(agent)
    expect(events.status).toBe(200)
    expect(events.body.data.pendingConversations).toEqual([
      { userId: user.id, latestMessage: 'Are you there?', latestMessageAt: second.body.data.createdAt, pendingCount: 2 },
    ])

    const answered = await reply(agent, user.id, 'Yes, hello!')
    expect(answered.status).toBe(201)
    expect(answered.body.data).toMatchObject({ userId: user.id, text: 'Yes, hello!' })
    expect((await poll(agent)).body.data.pendingConversations).toEqual([])

    const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
    expect(history.status).toBe(200)
    expect(history.body.data.map((m: { role: string; text: string }) => [m.role, m.text])).toEqual([
      ['agent', 'Yes, hello!'],
      ['user', 'Are you there?'],
      ['user', 'Hello agent'],
    ])
    expect(history.body.data[2].id).toBe(first.body.data.id)
    expect(history.body.data[0].id).toBe(answered.body.data.messageId)
    // Time-ordered ids: each message's is later than the one before it.
    const ids = [first.body.data.id, second.body.data.id, answered.body.data.messageId]
    for (const id of ids) expect(id).toMatch(uuidV7)
    expect([...ids].sort()).toEqual(ids)

    ctx.clock.advance(5)
    await send(user, agent, 'One more thing')
    const again = (await poll(agent)).body.data.pendingConversations
    expect(again.map((c: { latestMessage: string; pendingCount: number }) => [c.latestMessage, c.pendingCount])).toEqual([['One more thing', 1]])
  })

  test('since keeps conversations whose latest message is after it; a bad since is 400', async () => {
    const a = await subscribedPair()
    const userB = await signUp(ctx)
    const plan = (await ctx.call('GET', `/v1/billing/plans/${a.agent.id}`, { token: userB.token })).body.data[0]
    await ctx.call('POST', '/v1/billing/subscriptions', { token: userB.token, body: { planId: plan.id } })
    const early = await send(a.user, a.agent, 'early')
    ctx.clock.advance(50)
    const late = await send(userB, a.agent, 'late')
    const all = (await poll(a.agent)).body.data.pendingConversations
    expect(all.map((c: { latestMessage: string }) => c.latestMessage)).toEqual(['early', 'late'])
    const since = encodeURIComponent(early.body.data.createdAt)
    const after = (await poll(a.agent, `?since=${since}`)).body.data.pendingConversations
    expect(after.map((c: { userId: string }) => c.userId)).toEqual([userB.id])
    const sinceLate = encodeURIComponent(late.body.data.createdAt)
    expect((await poll(a.agent, `?since=${sinceLate}`)).body.data.pendingConversations).toEqual([])
    for (const bad of ['yesterday', '2026-13-01T00:00:00Z', '12345']) {
      expectError(await poll(a.agent, `?since=${encodeURIComponent(bad)}`), 400, 'validation_failed')
    }
  })

  test('since never skips a conversation written after the poll, however its clock and a chatty conversation’s differ', async () => {
    // Each reply is stamped by the API process's clock and each user message after it goes past it,
    // so a chatty conversation runs ahead of the agent's actor's clock (frozen here, as a skewed or
    // stepped one would be): a message of another user that arrives later must still be after it.
    const chatty = await subscribedPair()
    const other = await signUp(ctx)
    const plan = (await ctx.call('GET', `/v1/billing/plans/${chatty.agent.id}`, { token: other.token })).body.data[0]
    await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId: plan.id } })
    ctx.clock.freeze(new Date())
    try {
      for (let i = 0; i < 5; i++) {
        expect((await send(chatty.user, chatty.agent, `question ${i}`)).status).toBe(201)
        expect((await reply(chatty.agent, chatty.user.id, `answer ${i}`)).status).toBe(201)
      }
      await send(chatty.user, chatty.agent, 'last question')
      const seen = (await poll(chatty.agent)).body.data.pendingConversations
      expect(seen.map((c: { latestMessage: string }) => c.latestMessage)).toEqual(['last question'])
      const late = await send(other, chatty.agent, 'a newcomer')
      expect(late.status).toBe(201)
      const after = (await poll(chatty.agent, `?since=${encodeURIComponent(seen[0].latestMessageAt)}`)).body.data.pendingConversations
      expect(after.map((c: { userId: string }) => c.userId)).toEqual([other.id])
      const all = (await poll(chatty.agent)).body.data.pendingConversations
      expect(all.map((c: { userId: string }) => c.userId)).toEqual([chatty.user.id, other.id])
    } finally {
      ctx.clock.set(new Date())
    }
  })

  test('history pages newest first with limit and before', async () => {
    const { agent, user } = await subscribedPair()
    for (let i = 0; i < 5; i++) {
      await send(user, agent, `m${i}`)
      ctx.clock.advance(5)
    }
    const page = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?limit=2`, { token: user.token })
    expect(page.body.data.map((m: { text: string }) => m.text)).toEqual(['m4', 'm3'])
    const next = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?limit=2&before=${encodeURIComponent(page.body.data[1].createdAt)}`, {
      token: user.token,
    })
    expect(next.body.data.map((m: { text: string }) => m.text)).toEqual(['m2', 'm1'])
    expectError(await ctx.call('GET', `/v1/conversations/${agent.id}/messages?limit=101`, { token: user.token }), 400, 'validation_failed')
  })
})

describe('history’s before', () => {
  test('finer than a millisecond keeps a message strictly older than it, in that millisecond', async () => {
    const { agent, user } = await subscribedPair()
    const sent = await send(user, agent, 'at the boundary')
    const at = sent.body.data.createdAt as string
    const finer = `${at.slice(0, -1)}5Z`
    const page = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?before=${encodeURIComponent(finer)}`, { token: user.token })
    expect(page.body.data.map((m: { id: string }) => m.id)).toEqual([sent.body.data.id])
    const exact = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?before=${encodeURIComponent(at)}`, { token: user.token })
    expect(exact.body.data).toEqual([])
    const latest = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?before=9999-12-31T23:59:59.9999Z`, { token: user.token })
    expect(latest.body.data.map((m: { id: string }) => m.id)).toEqual([sent.body.data.id])
  })
})

describe('writing to an agent', () => {
  test('needs an active subscription (403 not_subscribed), a known agent (404) and 1 to 10,000 characters', async () => {
    const { agent, user, subscriptionId } = await subscribedPair()
    const stranger = await signUp(ctx)
    expectError(await send(stranger, agent, 'hi'), 403, 'not_subscribed')
    expectError(
      await ctx.call('POST', '/v1/conversations/00000000-0000-4000-8000-000000000000/messages', { token: user.token, body: { text: 'hi' } }),
      404,
      'not_found',
    )
    expectError(await send(user, agent, ''), 400, 'validation_failed')
    expectError(await send(user, agent, 'x'.repeat(10_001)), 400, 'validation_failed')
    expect((await send(user, agent, 'x'.repeat(10_000))).status).toBe(201)
    await ctx.call('DELETE', `/v1/billing/subscriptions/${subscriptionId}`, { token: user.token })
    expectError(await send(user, agent, 'still there?'), 403, 'not_subscribed')
    expectError(await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { apiKey: agent.apiKey, body: { text: 'hi' } }), 403, 'forbidden')
  })
})

describe('agent credentials', () => {
  test('the agent API takes an agent key in X-API-Key or as a bearer; a user credential is 403; none is 401', async () => {
    const { agent, user } = await subscribedPair()
    expect((await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).status).toBe(200)
    expect((await ctx.call('GET', '/v1/agent/events', { token: agent.apiKey })).status).toBe(200)
    expect((await ctx.call('GET', '/v1/agent/status', { token: agent.apiKey })).status).toBe(200)
    expectError(await ctx.call('GET', '/v1/agent/events', { token: user.token }), 403, 'forbidden')
    expectError(await ctx.call('GET', '/v1/agent/events'), 401, 'unauthorized')
    expectError(await ctx.call('GET', '/v1/agent/events', { apiKey: 'sk_agt_nope' }), 401, 'invalid_token')
    expectError(await ctx.call('POST', '/v1/agent/conversation-reply', { token: user.token, body: { userId: user.id, text: 'x' } }), 403, 'forbidden')
  })

  test('an agent never sees or answers another agent’s conversations', async () => {
    const a = await subscribedPair()
    const b = await subscribedPair()
    await send(a.user, a.agent, 'for A only')
    await send(b.user, b.agent, 'for B only')
    const seenByA = (await poll(a.agent)).body.data.pendingConversations
    const seenByB = (await poll(b.agent)).body.data.pendingConversations
    expect(seenByA.map((c: { latestMessage: string }) => c.latestMessage)).toEqual(['for A only'])
    expect(seenByB.map((c: { latestMessage: string }) => c.latestMessage)).toEqual(['for B only'])
    expectError(await reply(b.agent, a.user.id, 'sneaky'), 404, 'not_found')
    expectError(await reply(a.agent, b.user.id, 'sneaky'), 404, 'not_found')
    const historyA = await ctx.call('GET', `/v1/conversations/${a.agent.id}/messages`, { token: a.user.token })
    expect(historyA.body.data.map((m: { text: string }) => m.text)).toEqual(['for A only'])
    expect((await poll(a.agent)).body.data.pendingConversations.length).toBe(1)
  })

  test('a reply to a user who never wrote is 404 and a bad body is 400', async () => {
    const { agent } = await subscribedPair()
    const stranger = await signUp(ctx)
    expectError(await reply(agent, stranger.id, 'hello?'), 404, 'not_found')
    expectError(
      await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: 'nope', text: 'x' } }),
      400,
      'validation_failed',
    )
    expectError(
      await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: stranger.id } }),
      400,
      'validation_failed',
    )
  })
})

describe('status', () => {
  test('shows live subscribers, pending conversations and the balance', async () => {
    const { agent, user } = await subscribedPair()
    const status = async () => (await ctx.call('GET', '/v1/agent/status', { apiKey: agent.apiKey })).body.data
    expect(await status()).toEqual({ balanceCents: 0, activeSubscribers: 1, pendingConversations: 0 })
    await send(user, agent, 'hi')
    expect((await status()).pendingConversations).toBe(1)
    await reply(agent, user.id, 'hello')
    expect((await status()).pendingConversations).toBe(0)
    const config = await ctx.call('POST', '/v1/billing/configs', {
      token: owner.token,
      body: { participantId: agent.id, name: 'C', priceCents: 300, fileType: 'md', content: 'c' },
    })
    await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: user.token })
    expect((await status()).balanceCents).toBe(300)
  })
})

describe('the inbox in Redis', () => {
  test('is rebuilt from Postgres when Redis loses it', async () => {
    const { agent, user } = await subscribedPair()
    const other = await signUp(ctx)
    const plan = (await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: other.token })).body.data[0]
    await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId: plan.id } })
    await send(user, agent, 'first')
    await send(user, agent, 'second')
    await send(other, agent, 'answered')
    await reply(agent, other.id, 'done')
    const before = (await poll(agent)).body.data
    const keys = ctx.deps.keys.agent(agent.id)
    await ctx.deps.redis.del(keys.inbox, keys.requests, keys.built)
    await ctx.deps.redis.publish(ctx.deps.keys.channels.inboxChanged, agent.id)
    await Bun.sleep(50)
    const after = (await poll(agent)).body.data
    expect(after).toEqual(before)
    expect(after.pendingConversations).toMatchObject([{ userId: user.id, latestMessage: 'second', pendingCount: 2 }])
  })
})

describe('Idempotency-Key on replies and messages', () => {
  test('a repeated reply returns the first result and sends one message; another body is 409', async () => {
    const { agent, user } = await subscribedPair()
    await send(user, agent, 'question')
    const headers = { 'idempotency-key': 'reply-1' }
    const first = await reply(agent, user.id, 'answer', headers)
    const again = await reply(agent, user.id, 'answer', headers)
    expect(first.status).toBe(201)
    expect(again.status).toBe(201)
    expect(again.body.data).toEqual(first.body.data)
    expectError(await reply(agent, user.id, 'different', headers), 409, 'idempotency_key_reused')
    const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
    expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['answer', 'question'])
  })

  test('a key freed by a refusal, or used again after its 24 h, is a new reply, not the old answer', async () => {
    const { agent, user } = await subscribedPair()
    const headers = { 'idempotency-key': 'reply-again' }
    // No conversation yet: 404, and the key is free again.
    expectError(await reply(agent, user.id, 'too early', headers), 404, 'not_found')
    await send(user, agent, 'now a question')
    const answered = await reply(agent, user.id, 'too early', headers)
    expect(answered.status).toBe(201)
    expect((await poll(agent)).body.data.pendingConversations).toEqual([])

    // A day later the same key and body are a new reply to the new question.
    await ctx.deps.sql`update idempotency_keys set created_at = created_at - interval '25 hours' where key = 'reply-again'`
    await send(user, agent, 'and another')
    const later = await reply(agent, user.id, 'too early', headers)
    expect(later.status).toBe(201)
    expect(later.body.data.messageId).not.toBe(answered.body.data.messageId)
    expect((await poll(agent)).body.data.pendingConversations).toEqual([])
    const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
    expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['too early', 'and another', 'too early', 'now a question'])
  })

  test('a repeated user message is stored once and does not bring an answered conversation back', async () => {
    const { agent, user } = await subscribedPair()
    const headers = { 'idempotency-key': 'msg-1' }
    const first = await send(user, agent, 'hello', headers)
    await reply(agent, user.id, 'hi')
    const again = await send(user, agent, 'hello', headers)
    expect(again.body.data).toEqual(first.body.data)
    expect((await poll(agent)).body.data.pendingConversations).toEqual([])
    const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
    expect(history.body.data.length).toBe(2)
  })
})

describe('under load', () => {
  test('200 concurrent replies and messages across 20 agents all land, in per-agent order', async () => {
    const pairs = await Promise.all(Array.from({ length: 20 }, () => subscribedPair()))
    // Each agent gets 5 user messages and 5 replies, sent in order per agent, all agents at once.
    await Promise.all(
      pairs.map(async ({ agent, user }, index) => {
        for (let i = 0; i < 5; i++) {
          const sent = await send(user, agent, `u${index}-${i}`)
          expect(sent.status).toBe(201)
          const answered = await reply(agent, user.id, `a${index}-${i}`)
          expect(answered.status).toBe(201)
        }
      }),
    )
    // And 200 more at once, no waiting: they must all land and keep the order they were accepted in.
    const burst = await Promise.all(
      pairs.flatMap(({ agent, user }, index) => Array.from({ length: 10 }, (_, i) => send(user, agent, `b${index}-${i}`))),
    )
    expect(burst.every(r => r.status === 201)).toBe(true)
    for (const [index, { agent, user }] of pairs.entries()) {
      const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages?limit=100`, { token: user.token })
      const texts = history.body.data.map((m: { text: string }) => m.text).reverse()
      expect(texts.slice(0, 10)).toEqual(Array.from({ length: 5 }, (_, i) => [`u${index}-${i}`, `a${index}-${i}`]).flat())
      expect(texts.length).toBe(20)
      // Stored order is the order the actor applied them, which is the order their responses report.
      const accepted = burst
        .filter(r => r.body.data.text.startsWith(`b${index}-`))
        .sort((x, y) => x.body.data.createdAt.localeCompare(y.body.data.createdAt))
        .map(r => r.body.data.text)
      const [seqRows] = [
        await ctx.deps.sql`
        select text from messages where participant_id = ${agent.id} and text like 'b%' order by seq
      `,
      ]
      expect(seqRows.map(row => row.text)).toEqual(accepted)
      const pending = (await poll(agent)).body.data.pendingConversations
      expect(pending).toMatchObject([{ userId: user.id, pendingCount: 10, latestMessage: seqRows.at(-1)!.text }])
    }
  })
})

describe('replies of many agents at once', () => {
  test('share one statement; each lands in its own conversation, and one to a stranger is 404 alone', async () => {
    const pairs = await Promise.all(Array.from({ length: 12 }, () => subscribedPair()))
    for (const { agent, user } of pairs) expect((await send(user, agent, 'Anyone?')).status).toBe(201)
    const stranger = await signUp(ctx)
    const answers = await Promise.all([
      ...pairs.map(({ agent, user }, i) => reply(agent, user.id, `answer ${i}`)),
      reply(pairs[0]!.agent, stranger.id, 'Who are you?'),
    ])
    expect(answers.slice(0, 12).map(a => a.status)).toEqual(Array(12).fill(201))
    expectError(answers[12]!, 404, 'not_found')
    for (const [i, { agent, user }] of pairs.entries()) {
      const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
      expect(history.body.data.map((m: { text: string }) => m.text)).toEqual([`answer ${i}`, 'Anyone?'])
      expect((await poll(agent)).body.data.pendingConversations).toEqual([])
    }
    const [strays] = await ctx.deps.sql`select count(*)::int as n from messages where user_id = ${stranger.id}`
    expect(strays!.n).toBe(0)
  })

  test('a reply to a conversation that was not pending leaves the inbox alone and announces no change', async () => {
    const { agent, user } = await subscribedPair()
    await send(user, agent, 'One question')
    expect((await poll(agent)).body.data.pendingConversations).toHaveLength(1)
    // What every other process hears through Redis (this one's own readers are told at once as well).
    const announced: string[] = []
    const channel = ctx.deps.keys.channels.inboxChanged
    const listener = new Redis(redisUrl)
    try {
      listener.on('message', (_channel: string, id: string) => announced.push(id))
      await listener.subscribe(channel)
      // What was announced before (the message's write, the poll's rebuild) may still be on its way:
      // once a marker published now has come, all of it has, and it is not counted.
      const marker = randomUUID()
      await ctx.deps.redis.publish(channel, marker)
      await until(async () => announced.includes(marker))
      announced.length = 0
      expect((await reply(agent, user.id, 'First answer')).status).toBe(201)
      expect((await reply(agent, user.id, 'And one more thing')).status).toBe(201)
      await Bun.sleep(100)
    } finally {
      listener.disconnect()
    }
    // The first reply ended the pending state; the second had nothing to change.
    expect(announced.filter(id => id === agent.id)).toHaveLength(1)
    expect((await poll(agent)).body.data.pendingConversations).toEqual([])
  })
})

describe('the hot path', () => {
  test('a warm poll touches no Postgres: it still answers with the database gone', async () => {
    const own = await createTestContext({ actors: true })
    try {
      const owner = await signUp(own)
      const agent = await createAgent(own, owner)
      const plan = await own.call('POST', '/v1/billing/plans', {
        token: owner.token,
        body: { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
      })
      const user = await signUp(own)
      await own.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
      await own.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'still here?' } })
      const warm = await own.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })
      expect(warm.body.data.pendingConversations.length).toBe(1)
      await own.deps.sql.end()
      for (let i = 0; i < 5; i++) {
        const cold = await own.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })
        expect(cold.status).toBe(200)
        expect(cold.body.data).toEqual(warm.body.data)
      }
    } finally {
      await own.close().catch(() => {})
      await own.database.drop().catch(() => {})
    }
  })
})

describe('Idempotency-Key after an answer that never came', () => {
  test('a retry of a message whose actor did not answer in time (503) is applied once, not twice', async () => {
    // No runtime yet: the ask runs out (503, "it may have been").
    const quiet = await createTestContext()
    try {
      const someone = await signUp(quiet)
      const { agent, user, planId, subscriptionId } = await newPair(quiet, someone)
      const headers = { 'idempotency-key': 'msg-timeout' }
      const message = () => quiet.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello once' }, headers })
      const mailbox = () => quiet.deps.redis.xlen(quiet.deps.keys.actor(`agent:${agent.id}`).mailbox)
      const first = message()
      // The first is still waiting for its answer, its command in the mailbox: a repeat is told so
      // (CONTRACT.md §9), and sends nothing.
      await until(async () => (await mailbox()) === 1, 5000)
      const meanwhile = await message()
      expectError(meanwhile, 409, 'idempotency_key_in_progress')
      expect(Number(meanwhile.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      expect(Number(meanwhile.headers.get('retry-after'))).toBeLessThanOrEqual(10)
      expect(await mailbox()).toBe(1)
      expectError(await first, 503, 'unavailable')
      // A retry refused by its own checks (no longer subscribed) sent nothing, and frees nothing:
      // the first attempt's command is still on its way under the key.
      expect((await quiet.call('DELETE', `/v1/billing/subscriptions/${subscriptionId}`, { token: user.token })).status).toBe(200)
      expectError(await message(), 403, 'not_subscribed')
      expect((await quiet.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).status).toBe(201)
      const runtime = await startActors(quiet.deps, { leaseMs: 2000 })
      try {
        const retried = await message()
        expect(retried.status).toBe(201)
        const history = await quiet.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
        expect(history.body.data.map((m: { id: string; text: string }) => [m.id, m.text])).toEqual([[retried.body.data.id, 'hello once']])
      } finally {
        await runtime.stop()
      }
    } finally {
      await quiet.close()
    }
  }, 30_000)
})

describe('the messagePost budget', () => {
  test('a user past it gets 429 rate_limited with Retry-After, whichever agent they write to, and nothing is stored', async () => {
    const narrow = await createTestContext({
      actors: true,
      env: { RATE_LIMITS: JSON.stringify({ participantCreate: { capacity: 10000, perSeconds: 1 }, messagePost: { capacity: 3, perSeconds: 3600 } }) },
    })
    try {
      const owner = await signUp(narrow)
      const first = await newPair(narrow, owner)
      const write = (agent: TestAgent, text: string) =>
        narrow.call('POST', `/v1/conversations/${agent.id}/messages`, { token: first.user.token, body: { text } })
      for (const text of ['one', 'two', 'three']) expect((await write(first.agent, text)).status).toBe(201)
      const refused = await write(first.agent, 'four')
      expectError(refused, 429, 'rate_limited')
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0)

      // The same user, subscribed to another agent: the budget is the user's.
      const other = await createAgent(narrow, owner)
      const plan = await narrow.call('POST', '/v1/billing/plans', {
        token: owner.token,
        body: { participantId: other.id, name: 'Basic', monthlyPriceCents: 100, includedProxyCalls: 10, overagePerCallCents: 1 },
      })
      await narrow.call('POST', '/v1/billing/subscriptions', { token: first.user.token, body: { planId: plan.body.data.id } })
      expectError(await write(other, 'elsewhere'), 429, 'rate_limited')
      const [row] = await narrow.deps.sql`select count(*)::int as n from messages where user_id = ${first.user.id}`
      expect(row!.n).toBe(3)

      // Another user has a bucket of their own.
      const second = await newPair(narrow, owner)
      const theirs = await narrow.call('POST', `/v1/conversations/${second.agent.id}/messages`, { token: second.user.token, body: { text: 'hi' } })
      expect(theirs.status).toBe(201)
    } finally {
      await narrow.close()
    }
  })
})
