/** Replies, applied by the agent's actor like the user's messages: order, repeats, refusals, and the inbox's fenced writes. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { newRowId } from '../src/ids.ts'
import { putOpenRequest, rebuildInbox, writeConversation, type OpenServiceRequest } from '../src/conversations/inbox.ts'
import { insertUserMessage, pendingConversations, storeReply } from '../src/conversations/store.ts'
import { actorKinds } from '../src/deps.ts'
import { HoldLost } from '../src/actors/types.ts'
import { applyTurn } from '../src/actors/turn.ts'
import { createRepairs } from '../src/actors/repairs.ts'
import { holdActor } from './helpers/hold.ts'
import { createSql, type Sql } from '../src/db.ts'
import {
  createTestContext,
  expectError,
  signUp,
  subscribedPair as newPair,
  type Subscribed,
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
/** Another user, subscribed to the pair's plan. */
const anotherSubscriber = async (pair: Subscribed) => {
  const other = await signUp(ctx)
  await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId: pair.planId } })
  return other
}
const send = (user: TestUser, agent: TestAgent, text: string) =>
  ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text } })
const reply = (agent: TestAgent, userId: string, text: string, headers?: Record<string, string>) =>
  ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId, text }, headers })
const history = async ({ agent, user }: Subscribed) =>
  (await ctx.call('GET', `/v1/conversations/${agent.id}/messages?limit=100`, { token: user.token })).body.data as {
    id: string
    role: string
    text: string
    createdAt: string
  }[]

/** The agent's inbox entries as Redis holds them, by user. */
const inboxInRedis = async (agentId: string) => {
  const raw = await ctx.deps.redis.hgetall(ctx.deps.keys.agent(agentId).inbox)
  return Object.fromEntries(Object.entries(raw).map(([userId, value]) => [userId, JSON.parse(value)]))
}

const conversationRow = async (agentId: string, userId: string) => {
  const [row] = await ctx.deps.sql<{ pendingCount: number; latestMessage: string }[]>`
    select pending_count as "pendingCount", latest_user_message as "latestMessage"
    from conversations where participant_id = ${agentId} and user_id = ${userId}
  `
  return row!
}

describe('a reply and the user racing on one conversation', () => {
  test('leave the inbox as Postgres has it, whichever lands first', async () => {
    const pairs = await Promise.all(Array.from({ length: 6 }, () => subscribedPair()))
    for (const { agent, user } of pairs) expect((await send(user, agent, 'first')).status).toBe(201)
    await Promise.all(
      pairs.map(async ({ agent, user }, p) => {
        for (let round = 0; round < 12; round++) {
          // The reply and the next message go out together: either may take the row first.
          const [answered, sent] = await Promise.all([reply(agent, user.id, `a${p}-${round}`), send(user, agent, `u${p}-${round}`)])
          expect(answered.status).toBe(201)
          expect(sent.status).toBe(201)
        }
      }),
    )
    for (const { agent, user } of pairs) {
      const row = await conversationRow(agent.id, user.id)
      const entries = await inboxInRedis(agent.id)
      if (row.pendingCount === 0) expect(entries[user.id]).toBeUndefined()
      else expect(entries[user.id]).toMatchObject({ latestMessage: row.latestMessage, pendingCount: row.pendingCount })
      // The poll agrees once this process has heard of the last change.
      await until(async () => {
        const polled = (await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).body.data.pendingConversations
        return polled.length === (row.pendingCount === 0 ? 0 : 1)
      }, 5000)
    }
  }, 30_000)
})

describe('a reply’s time', () => {
  test('is never before the message it answers, whatever the replying process’s clock says', async () => {
    const pair = await subscribedPair()
    const asked = await send(pair.user, pair.agent, 'What time is it?')
    ctx.clock.advance(-60_000)
    try {
      const answered = await reply(pair.agent, pair.user.id, 'Earlier than you think')
      expect(answered.status).toBe(201)
      expect(answered.body.data.createdAt > asked.body.data.createdAt).toBe(true)
    } finally {
      ctx.clock.advance(60_000)
    }
    expect((await history(pair)).map(m => m.text)).toEqual(['Earlier than you think', 'What time is it?'])
  })
})

describe('a repeat under one Idempotency-Key whose first answer was lost', () => {
  test('finds the stored reply, stores nothing, and leaves a newer message pending', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'question one')
    const headers = { 'idempotency-key': `lost-${newRowId()}` }
    const first = await reply(pair.agent, pair.user.id, 'answer one', headers)
    expect(first.status).toBe(201)
    // Its id comes from the reservation, the same for every repeat, and is still time-ordered.
    expect(first.body.data.messageId).toMatch(uuidV7)
    // The process died before it could keep the outcome: the reservation is still in progress.
    await ctx.deps.sql`
      update idempotency_keys set response_status = null, response_body = null where key = ${headers['idempotency-key']}
    `
    const asked = await send(pair.user, pair.agent, 'question two')
    const again = await reply(pair.agent, pair.user.id, 'answer one', headers)
    expect(again.status).toBe(201)
    expect(again.body.data).toEqual(first.body.data)
    expect((await history(pair)).map(m => m.text)).toEqual(['question two', 'answer one', 'question one'])
    const row = await conversationRow(pair.agent.id, pair.user.id)
    expect(row.pendingCount).toBe(1)
    expect((await inboxInRedis(pair.agent.id))[pair.user.id]).toMatchObject({
      latestMessage: 'question two',
      latestMessageAt: asked.body.data.createdAt,
    })
    // The user is told once: the event was committed with the first attempt, and the repeat stored nothing.
    const told = async () =>
      (await ctx.deps.redis.xrange(ctx.deps.keys.events.user(pair.user.id), '-', '+')).filter(
        ([, fields]) => fields[1] === 'conversation.reply' && fields[3]!.includes(first.body.data.messageId),
      ).length
    await until(async () => (await told()) > 0, 5000)
    await until(async () => (await ctx.deps.sql`select 1 from outbox where user_id = ${pair.user.id}`).length === 0, 5000)
    expect(await told()).toBe(1)
  })
})

/** A connection of its own, and a way to end it. */
const connection = async () => {
  const sql: Sql = createSql(ctx.database.url, { max: 1 })
  return { sql }
}

describe('a conversation’s row', () => {
  test('is updated in place (HOT) by a user’s message and by the reply that answers it, and the inbox is still rebuilt from the pending ones', async () => {
    const pair = await subscribedPair()
    const other = await anotherSubscriber(pair)
    const ids = { participantId: pair.agent.id, userId: pair.user.id }
    const c = await connection()
    try {
      await insertUserMessage(c.sql, { id: newRowId(), ...ids, text: 'first, making the row', at: new Date() })
      await storeReply(c.sql, { id: newRowId(), ...ids, text: 'answered', at: new Date() })
      await insertUserMessage(c.sql, { id: newRowId(), ...ids, text: 'waiting', at: new Date() })
      await insertUserMessage(c.sql, { id: newRowId(), participantId: pair.agent.id, userId: other.id, text: 'also waiting', at: new Date() })
      // Pending to answered, answered to pending, and answered again: each a change of the pending
      // count, counted by this backend alone (its counts of the transaction under way, before and
      // after: Postgres 15 adds what earlier transactions left unflushed, so the difference is read).
      const counted = await c.sql.begin(async tx => {
        const counts = async () => {
          const [row] = await tx<{ all: number; hot: number }[]>`
            select pg_stat_get_xact_tuples_updated('conversations'::regclass)::int as all,
              pg_stat_get_xact_tuples_hot_updated('conversations'::regclass)::int as hot
          `
          return row!
        }
        const before = await counts()
        expect(await storeReply(tx, { id: newRowId(), ...ids, text: 'answer', at: new Date() })).toMatchObject({ wasPending: true })
        await insertUserMessage(tx, { id: newRowId(), ...ids, text: 'again', at: new Date() })
        await storeReply(tx, { id: newRowId(), ...ids, text: 'answer again', at: new Date() })
        const after = await counts()
        return { all: after.all - before.all, hot: after.hot - before.hot }
      })
      expect(counted).toEqual({ all: 3, hot: 3 })
      const pending = (await pendingConversations(c.sql, pair.agent.id)).map(p => [p.userId, p.latestMessage, p.pendingCount])
      expect(pending).toEqual([[other.id, 'also waiting', 1]])
    } finally {
      await c.sql.end()
    }
  })

  test('has room on its pages for updates in place, and only its primary key as an index', async () => {
    const [table] = await ctx.deps.sql<{ options: string[] | null }[]>`
      select reloptions as options from pg_class where oid = 'conversations'::regclass
    `
    expect(table!.options).toEqual(['fillfactor=80'])
    const indexes = await ctx.deps.sql<{ name: string }[]>`
      select c.relname as name from pg_index i join pg_class c on c.oid = i.indexrelid
      where i.indrelid = 'conversations'::regclass order by c.relname
    `
    expect(indexes.map(index => index.name)).toEqual(['conversations_pkey'])
  })
})

describe('the inbox’s writes, fenced by the hold', () => {
  const entry = (userId: string, latestMessage: string) => ({ userId, latestMessage, latestMessageAt: new Date().toISOString(), pendingCount: 1 })
  const fenceOf = async (agentId: string) => {
    const k = ctx.deps.keys.actor(`agent:${agentId}`)
    const [holder, token] = await Promise.all([ctx.deps.redis.get(k.lease), ctx.deps.redis.get(k.fence)])
    return { holder: holder!, token: Number(token) }
  }

  test('land while the hold stands, and announce each change', async () => {
    const [agentId, userId] = [newRowId(), newRowId()]
    const changes: string[] = []
    const stop = await ctx.deps.pubsub.subscribe(ctx.deps.keys.channels.inboxChanged, id => void changes.push(id))
    const letGo = (await holdActor(ctx.deps, `agent:${agentId}`))!
    try {
      const fence = await fenceOf(agentId)
      await writeConversation(ctx.deps, agentId, fence, userId, entry(userId, 'waiting'))
      expect((await inboxInRedis(agentId))[userId]).toMatchObject({ latestMessage: 'waiting' })
      await writeConversation(ctx.deps, agentId, fence, userId, null)
      expect(await inboxInRedis(agentId)).toEqual({})
      await until(async () => changes.filter(id => id === agentId).length === 2, 2000)
    } finally {
      await letGo()
      await stop()
    }
  })

  test('refuse a holder whose hold is gone: let go, or taken again since (by anyone, itself included)', async () => {
    const [agentId, userId] = [newRowId(), newRowId()]
    const actor = `agent:${agentId}`
    const letGo = (await holdActor(ctx.deps, actor))!
    const stale = await fenceOf(agentId)
    await letGo()
    await expect(writeConversation(ctx.deps, agentId, stale, userId, entry(userId, 'late'))).rejects.toBeInstanceOf(HoldLost)
    // The same holder id holding again draws a new token: the old hold's writes stay refused.
    await ctx.deps.redis.set(ctx.deps.keys.actor(actor).lease, stale.holder)
    await ctx.deps.redis.incr(ctx.deps.keys.actor(actor).fence)
    await expect(writeConversation(ctx.deps, agentId, stale, userId, entry(userId, 'late'))).rejects.toBeInstanceOf(HoldLost)
    await expect(putOpenRequest(ctx.deps, agentId, stale, { requestId: newRowId() } as OpenServiceRequest)).rejects.toBeInstanceOf(HoldLost)
    expect(await inboxInRedis(agentId)).toEqual({})
    expect(await ctx.deps.redis.hlen(ctx.deps.keys.agent(agentId).requests)).toBe(0)
    await writeConversation(ctx.deps, agentId, await fenceOf(agentId), userId, entry(userId, 'current'))
    expect((await inboxInRedis(agentId))[userId]).toMatchObject({ latestMessage: 'current' })
    await ctx.deps.redis.del(ctx.deps.keys.actor(actor).lease)
  })

  test('a rebuild replaces the inbox with what Postgres holds; one whose hold ran out writes nothing', async () => {
    const rebuilt = newRowId()
    const [gone, waiting] = [newRowId(), newRowId()]
    const letGo = (await holdActor(ctx.deps, `agent:${rebuilt}`))!
    const fence = await fenceOf(rebuilt)
    await writeConversation(ctx.deps, rebuilt, fence, gone, entry(gone, 'answered since'))
    expect(await rebuildInbox(ctx.deps, rebuilt, fence, { conversations: [entry(waiting, 'as read')], requests: [] })).toBe(true)
    expect(Object.keys(await inboxInRedis(rebuilt))).toEqual([waiting])
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(rebuilt).built)).toBe(1)
    await letGo()

    await ctx.deps.redis.del(ctx.deps.keys.agent(rebuilt).built)
    // Another holder took the actor after this rebuild's lease ran out.
    const again = (await holdActor(ctx.deps, `agent:${rebuilt}`))!
    expect(await rebuildInbox(ctx.deps, rebuilt, fence, { conversations: [], requests: [] })).toBe(false)
    expect(Object.keys(await inboxInRedis(rebuilt))).toEqual([waiting])
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(rebuilt).built)).toBe(0)
    await again()
  })

  test('a projection refused for a lost hold is repaired: the next poll rebuilds the inbox with the change', async () => {
    const pair = await subscribedPair()
    const poll = async () =>
      (await ctx.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })).body.data.pendingConversations as { userId: string }[]
    expect(await poll()).toEqual([])
    const kinds = actorKinds(ctx.deps)
    const actor = `agent:${pair.agent.id}`
    const letGo = (await holdActor(ctx.deps, actor))!
    const fence = await fenceOf(pair.agent.id)
    await letGo()
    const repairs = createRepairs(ctx.deps.log)
    // A turn whose hold was taken over between its commit and its projection.
    const command = { commandId: newRowId(), entryId: newRowId(), type: 'user.message', requestHash: null, mayRepeat: false, record: false }
    const message = { messageId: newRowId(), userId: pair.user.id, text: 'committed, never projected' }
    const taker = (await holdActor(ctx.deps, actor))!
    await applyTurn(
      { sql: ctx.deps.sql, clock: ctx.clock, kinds, log: ctx.deps.log, repairs, leaseMs: 10_000 },
      [
        {
          actor,
          kind: 'agent',
          ...fence,
          token: Number((await ctx.deps.redis.get(ctx.deps.keys.actor(actor).fence))!),
          commands: [{ ...command, payload: () => message }],
        },
      ],
      () => true,
    ).catch(() => undefined)
    await taker()
    expect(await inboxInRedis(pair.agent.id)).toEqual({})
    await repairs.close()
    await until(async () => (await poll()).map(c => c.userId).includes(pair.user.id), 5000)
  })
})

describe('a reply after the subscription ended', () => {
  test('answers a message sent while subscribed, once; then, with nothing waiting, is 403 not_subscribed', async () => {
    const pair = await subscribedPair()
    expect((await send(pair.user, pair.agent, 'one last question')).status).toBe(201)
    const [subscription] = await ctx.deps.sql<{ id: string }[]>`
      select id from subscriptions where user_id = ${pair.user.id} and participant_id = ${pair.agent.id}
    `
    expect((await ctx.call('DELETE', `/v1/billing/subscriptions/${subscription!.id}`, { token: pair.user.token })).status).toBeLessThan(300)
    expect((await reply(pair.agent, pair.user.id, 'the answer')).status).toBe(201)
    const refused = await reply(pair.agent, pair.user.id, 'and one more thing')
    expectError(refused, 403, 'not_subscribed')
    expect((await history(pair)).map(m => m.text)).toEqual(['the answer', 'one last question'])
  })

  test('to a user who never wrote is 404; a subscriber with nothing waiting may still be written to', async () => {
    const pair = await subscribedPair()
    expectError(await reply(pair.agent, pair.user.id, 'hello?'), 404, 'not_found')
    expect((await send(pair.user, pair.agent, 'hi')).status).toBe(201)
    expect((await reply(pair.agent, pair.user.id, 'hello')).status).toBe(201)
    expect((await reply(pair.agent, pair.user.id, 'and a follow-up')).status).toBe(201)
  })
})

describe('an agent’s projection given up (lease lost, or closing, with Redis refusing it)', () => {
  test('is repaired by rebuilding the inbox from Postgres, for conversations and service requests alike', async () => {
    const pair = await subscribedPair()
    const poll = async () =>
      (await ctx.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })).body.data.pendingConversations as { userId: string }[]
    // The inbox is built (nothing pending), then a message is applied whose projection never lands.
    expect(await poll()).toEqual([])
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(pair.agent.id).built)).toBe(1)
    await insertUserMessage(ctx.deps.sql, {
      id: newRowId(),
      participantId: pair.agent.id,
      userId: pair.user.id,
      text: 'seen by no one',
      at: new Date(),
    })
    expect(await inboxInRedis(pair.agent.id)).toEqual({})

    const agent = actorKinds(ctx.deps).agent!
    const context = { actor: `agent:${pair.agent.id}`, id: pair.agent.id, commandId: 'lost' }
    for (const type of ['user.message', 'agent.reply', 'service.request', 'service.respond']) expect(agent[type]!.repair).toBeFunction()
    await agent['user.message']!.repair!(context)
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(pair.agent.id).built)).toBe(0)
    await until(async () => (await poll()).map(c => c.userId).includes(pair.user.id), 5000)
    expect(Object.keys(await inboxInRedis(pair.agent.id))).toEqual([pair.user.id])

    // The service-request commands repair the same inbox.
    await agent['service.request']!.repair!(context)
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(pair.agent.id).built)).toBe(0)
    await until(async () => (await poll()).length === 1 && (await ctx.deps.redis.exists(ctx.deps.keys.agent(pair.agent.id).built)) === 1, 5000)
  })
})

describe('an agent’s replies past its replyPost budget', () => {
  test('are 429 with Retry-After and store nothing; a repeat under an Idempotency-Key is not charged again', async () => {
    const limited = await createTestContext({ actors: true, env: { RATE_LIMITS: JSON.stringify({ replyPost: { capacity: 3, perSeconds: 3600 } }) } })
    try {
      const pair = await newPair(limited, await signUp(limited))
      await limited.call('POST', `/v1/conversations/${pair.agent.id}/messages`, { token: pair.user.token, body: { text: 'q' } })
      const replyTo = (text: string, headers?: Record<string, string>) =>
        limited.call('POST', '/v1/agent/conversation-reply', { apiKey: pair.agent.apiKey, body: { userId: pair.user.id, text }, headers })
      const keyed = { 'idempotency-key': `budget-${newRowId()}` }
      expect((await replyTo('one', keyed)).status).toBe(201)
      expect((await replyTo('one', keyed)).status).toBe(201)
      expect((await replyTo('two')).status).toBe(201)
      expect((await replyTo('three')).status).toBe(201)
      const refused = await replyTo('four')
      expectError(refused, 429, 'rate_limited')
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0)
      const texts = (await limited.call('GET', `/v1/conversations/${pair.agent.id}/messages?limit=100`, { token: pair.user.token })).body.data.map(
        (m: { text: string }) => m.text,
      )
      expect(texts).toEqual(['three', 'two', 'one', 'q'])
    } finally {
      await limited.close()
    }
  })
})
