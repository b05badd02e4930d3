/** Replies written by the API process, not the actor: ordering by the conversation's row and version, repeats, failures. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Redis } from 'ioredis'
import { newRowId } from '../src/ids.ts'
import { commandLeaseMs } from '../src/idempotency/idempotent.ts'
import {
  beginRebuild,
  builtMark,
  finishRebuild,
  rebuildConversations,
  writeConversation,
  type StoredConversation,
} from '../src/conversations/inbox.ts'
import { createReplyWriter, type ReplyWriter } from '../src/conversations/replies.ts'
import { replyAsAgent } from '../src/conversations/agent-reply.ts'
import { createInboxReader } from '../src/conversations/inbox-reader.ts'
import { createPubSub } from '../src/pubsub.ts'
import { agentConversations, insertUserMessage, storeChosenReplies, storeFreshReplies } from '../src/conversations/store.ts'
import { actorKinds, relayEffects } from '../src/deps.ts'
import { relayPass } from '../src/events/relay.ts'
import { holdActor } from './helpers/hold.ts'
import { createSql, type Db, type Sql } from '../src/db.ts'
import { createApp, type App } from '../src/app.ts'
import { createLog } from '../src/log.ts'
import {
  callApp,
  createTestContext,
  expectError,
  redisUrl,
  signUp,
  subscribedPair as newPair,
  type Subscribed,
  type TestAgent,
  type TestContext,
  type TestUser,
  uuidV7,
} from './helpers/context.ts'
import { until } from './helpers/until.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { startActors } from '../workers/actors.ts'
import { holdDeactivation, lockWaited } from './helpers/deactivation.ts'
import { deactivateAgent } from '../src/participants/deactivate.ts'

/** The rest of a rebuild as the inbox reader makes one, after it emptied the inbox and read: the conversations, then the requests and the mark. */
const rebuildInbox = async (deps: TestContext['deps'], agentId: string, holder: string, conversations: StoredConversation[]) =>
  (await rebuildConversations(deps, agentId, holder, conversations)) &&
  (await finishRebuild(deps, agentId, holder, builtMark('run-id', 'database'), []))

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
const replyThrough = (app: App, { agent, user }: Subscribed, text: string) =>
  callApp(app, 'POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text } })
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
  const [row] = await ctx.deps.sql<{ pendingCount: number; latestMessage: string; version: number }[]>`
    select pending_count as "pendingCount", latest_user_message as "latestMessage", version
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
      expect(await ctx.deps.redis.hget(ctx.deps.keys.agent(agent.id).versions, user.id)).toBe(String(row.version))
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
    // The process died before it could keep the outcome: the reservation is still in progress, its
    // lease (no longer renewed) lapsed, so the repeat takes it over (CONTRACT.md §9: 409 before then).
    await ctx.deps.sql`
      update idempotency_keys set response_status = null, response_body = null,
        created_at = ${new Date(ctx.clock.now().getTime() - commandLeaseMs)}
      where key = ${headers['idempotency-key']}
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

/** Waits until `pid`'s backend is blocked by another (on a row lock, say). */
const blocked = (pid: number) =>
  until(async () => {
    const [row] = await ctx.deps.sql<{ waiting: boolean }[]>`select cardinality(pg_blocking_pids(${pid})) > 0 as waiting`
    return row!.waiting
  }, 5000)

/** Releases of transactions `heldOpen` began: a test that fails midway lets them go before ending its connections. */
const stillHeld = new Set<() => void>()
const releaseHeld = () => {
  for (const release of stillHeld) release()
  stillHeld.clear()
}

/**
 * A transaction on `sql` that runs `work` and then stays open, holding its locks, until released.
 * `holding` resolves once `work` is done (not when the backend first looks idle in its transaction,
 * which it also does between BEGIN and the first statement).
 */
const heldOpen = <T>(sql: Sql, work: (tx: Db) => Promise<T>) => {
  let release!: () => void
  let held!: () => void
  const released = new Promise<void>(resolve => (release = resolve))
  const holds = new Promise<void>(resolve => (held = resolve))
  const result = sql.begin(async tx => {
    const out = await work(tx)
    held()
    await released
    return out
  }) as Promise<T>
  // A transaction that fails before it holds anything fails the wait too.
  const holding = Promise.race([holds, result.then(() => Promise.reject(new Error('the transaction ended before it held its locks')))])
  stillHeld.add(release)
  return { holding, release, result }
}

/** A connection of its own, its backend's pid, and a way to end it. */
const connection = async () => {
  const sql: Sql = createSql(ctx.database.url, { max: 1 })
  const [row] = await sql<{ pid: number }[]>`select pg_backend_pid() as pid`
  return { sql, pid: row!.pid }
}

describe('a conversation’s row', () => {
  test('is updated in place (HOT) by a user’s message and by the reply that answers it, and the inbox is still rebuilt from the pending ones', async () => {
    const pair = await subscribedPair()
    const other = await anotherSubscriber(pair)
    const ids = { participantId: pair.agent.id, userId: pair.user.id }
    const c = await connection()
    try {
      await insertUserMessage(c.sql, { id: newRowId(), ...ids, text: 'first, making the row', at: new Date() })
      await storeFreshReplies(c.sql, [{ id: newRowId(), ...ids, text: 'answered' }], new Date(), false)
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
        const answered = await storeFreshReplies(tx, [{ id: newRowId(), ...ids, text: 'answer' }], new Date(), false)
        expect([...answered.values()][0]).toMatchObject({ stored: true, wasPending: true })
        await insertUserMessage(tx, { id: newRowId(), ...ids, text: 'again', at: new Date() })
        await storeFreshReplies(tx, [{ id: newRowId(), ...ids, text: 'answer again' }], new Date(), false)
        const after = await counts()
        return { all: after.all - before.all, hot: after.hot - before.hot }
      })
      expect(counted).toEqual({ all: 3, hot: 3 })
      const pending = (await agentConversations(c.sql, pair.agent.id, { afterUserId: null, limit: 100 })).flatMap(({ pending: p }) =>
        p ? [[p.userId, p.latestMessage, p.pendingCount]] : [],
      )
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

describe('the reply statement and a user’s message on one conversation', () => {
  test('a repeat resent while its first attempt commits never answers the message that follows it', async () => {
    // One agent, two users: the repeat's statement also holds a reply to the conversation that sorts
    // first, and waits there (on a lock held here) while the first attempt and the next message commit.
    const pair = await subscribedPair()
    const other = await anotherSubscriber(pair)
    for (const user of [pair.user, other]) await send(user, pair.agent, 'question one')
    const [earlier, later] = [pair.user, other].sort((a, b) => (a.id < b.id ? -1 : 1)) as [TestUser, TestUser]
    const [first, holder, repeat] = [await connection(), await connection(), await connection()]
    try {
      const id = newRowId()
      const resent = { id, participantId: pair.agent.id, userId: later.id, text: 'answer one' }
      const firstAttempt = heldOpen(first.sql, tx => storeChosenReplies(tx, [resent], new Date(), true))
      await firstAttempt.holding
      const held = heldOpen(
        holder.sql,
        tx => tx`select 1 from conversations where participant_id = ${pair.agent.id} and user_id = ${earlier.id} for update`,
      )
      await held.holding
      // Its snapshot is taken now, before the first attempt commits.
      const repeated = storeChosenReplies(
        repeat.sql,
        [{ id: newRowId(), participantId: pair.agent.id, userId: earlier.id, text: 'to the other' }, resent],
        new Date(),
        true,
      )
      await blocked(repeat.pid)
      firstAttempt.release()
      expect((await firstAttempt.result).get(id)).toMatchObject({ stored: true, wasPending: true })
      await insertUserMessage(ctx.deps.sql, { id: newRowId(), participantId: pair.agent.id, userId: later.id, text: 'question two', at: new Date() })
      held.release()
      await held.result
      const outcome = (await repeated).get(id)
      expect(outcome).toMatchObject({ stored: false, conversation: { pendingCount: 1, latestMessage: 'question two' } })
      expect(await conversationRow(pair.agent.id, later.id)).toMatchObject({ pendingCount: 1, latestMessage: 'question two' })
      const texts = (await ctx.call('GET', `/v1/conversations/${pair.agent.id}/messages`, { token: later.token })).body.data.map(
        (m: { text: string }) => m.text,
      )
      expect(texts).toEqual(['question two', 'answer one', 'question one'])
    } finally {
      releaseHeld()
      for (const c of [first, holder, repeat]) await c.sql.end()
    }
  })

  test('a reply to an answered conversation waits for a message being written, answers it, and comes after it', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'question one')
    expect((await reply(pair.agent, pair.user.id, 'answer one')).status).toBe(201)
    const [user, replying] = [await connection(), await connection()]
    try {
      const asked = heldOpen(user.sql, tx =>
        insertUserMessage(tx, { id: newRowId(), participantId: pair.agent.id, userId: pair.user.id, text: 'question two', at: new Date() }),
      )
      await asked.holding
      // Written by a process whose clock is a minute behind.
      const id = newRowId()
      const answering = storeFreshReplies(
        replying.sql,
        [{ id, participantId: pair.agent.id, userId: pair.user.id, text: 'answer two' }],
        new Date(Date.now() - 60_000),
        true,
      )
      await blocked(replying.pid)
      asked.release()
      const question = await asked.result
      const answer = (await answering).get(id)!
      expect(answer).toMatchObject({ stored: true, wasPending: true })
      expect(answer.createdAt.getTime()).toBeGreaterThan(question!.createdAt.getTime())
      expect((await conversationRow(pair.agent.id, pair.user.id)).pendingCount).toBe(0)
      expect((await history(pair)).map(m => m.text)).toEqual(['answer two', 'question two', 'answer one', 'question one'])
    } finally {
      releaseHeld()
      for (const c of [user, replying]) await c.sql.end()
    }
  })
})

describe('the inbox’s one write rule', () => {
  const entry = (userId: string, latestMessage: string) => ({ userId, latestMessage, latestMessageAt: new Date().toISOString(), pendingCount: 1 })
  // What every other process hears through Redis (this one's own readers are told at once as well).
  const changes: string[] = []
  const listener = new Redis(redisUrl)
  beforeAll(async () => {
    listener.on('message', (_channel: string, id: string) => changes.push(id))
    await listener.subscribe(ctx.deps.keys.channels.inboxChanged)
  })
  afterAll(() => listener.disconnect())
  const announced = async (agentId: string) => {
    await Bun.sleep(50)
    return changes.filter(id => id === agentId).length
  }

  test('applies a change only when newer than the last one written, and announces only what it applied', async () => {
    const [agentId, userId] = [newRowId(), newRowId()]
    await writeConversation(ctx.deps, agentId, userId, 2, entry(userId, 'second'))
    // The answer to an older message, landing late.
    await writeConversation(ctx.deps, agentId, userId, 1, null)
    expect((await inboxInRedis(agentId))[userId]).toMatchObject({ latestMessage: 'second' })
    expect(await announced(agentId)).toBe(1)

    await writeConversation(ctx.deps, agentId, userId, 3, null)
    expect((await inboxInRedis(agentId))[userId]).toBeUndefined()
    // The message the reply answered, written after it (its projection retried late): kept out.
    await writeConversation(ctx.deps, agentId, userId, 2, entry(userId, 'second, late'))
    expect((await inboxInRedis(agentId))[userId]).toBeUndefined()
    expect(await announced(agentId)).toBe(2)

    await writeConversation(ctx.deps, agentId, userId, 4, entry(userId, 'fourth'))
    expect((await inboxInRedis(agentId))[userId]).toMatchObject({ latestMessage: 'fourth' })
    expect(await announced(agentId)).toBe(3)
  })

  test('is the same for every writer, held or not: a late put never undoes an answer, however late', async () => {
    const [agentId, userId] = [newRowId(), newRowId()]
    const letGo = (await holdActor(ctx.deps, `agent:${agentId}`))!
    await writeConversation(ctx.deps, agentId, userId, 6, null)
    await letGo()
    await Bun.sleep(20)
    await writeConversation(ctx.deps, agentId, userId, 5, entry(userId, 'answered long ago'))
    expect(await inboxInRedis(agentId)).toEqual({})
  })

  test('a rebuild keeps a conversation a newer reply answered meanwhile out, and one written newer in', async () => {
    const rebuilt = newRowId()
    const [answered, waiting, newer] = [newRowId(), newRowId(), newRowId()]
    const letGo = (await holdActor(ctx.deps, `agent:${rebuilt}`))!
    const holder = (await ctx.deps.redis.get(ctx.deps.keys.actor(`agent:${rebuilt}`).lease))!
    expect(await beginRebuild(ctx.deps, rebuilt, holder)).toBe(true)
    // The rebuild read all three at version 5; a reply to one (6) and a message to another (7) landed before it wrote.
    await writeConversation(ctx.deps, rebuilt, answered, 6, null)
    await writeConversation(ctx.deps, rebuilt, newer, 7, entry(newer, 'newer'))
    const written = await rebuildInbox(
      ctx.deps,
      rebuilt,
      holder,
      [answered, waiting, newer].map(userId => ({ userId, version: 5, pending: entry(userId, 'as read') })),
    )
    expect(written).toBe(true)
    const inbox = await inboxInRedis(rebuilt)
    expect(Object.keys(inbox).sort()).toEqual([waiting, newer].sort())
    expect(inbox[newer]).toMatchObject({ latestMessage: 'newer' })
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(rebuilt).built)).toBe(1)
    await letGo()
  })

  test('a rebuild whose hold ran out meanwhile writes nothing', async () => {
    const rebuilt = newRowId()
    const waiting = newRowId()
    // Another holder took the actor after this rebuild's lease ran out.
    const letGo = (await holdActor(ctx.deps, `agent:${rebuilt}`))!
    expect(await beginRebuild(ctx.deps, rebuilt, 'the slow rebuild')).toBe(false)
    const written = await rebuildInbox(ctx.deps, rebuilt, 'the slow rebuild', [{ userId: waiting, version: 5, pending: entry(waiting, 'older') }])
    expect(written).toBe(false)
    expect(await inboxInRedis(rebuilt)).toEqual({})
    expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(rebuilt).built)).toBe(0)
    await letGo()
  })
})

describe('the reply writer', () => {
  const toPair = ({ agent, user }: Subscribed, text: string) =>
    ctx.deps.replies.send({ agentId: agent.id, userId: user.id, text, messageId: newRowId(), chosen: false })
  const within = <T>(promise: Promise<T>, ms = 5000) => Promise.race([promise, Bun.sleep(ms).then(() => 'still waiting' as const)])
  const lockRow = (tx: Db, { agent, user }: Subscribed) =>
    tx`select 1 from conversations where participant_id = ${agent.id} and user_id = ${user.id} for update`
  /** Each conversation holds its user's message and the one reply, stored once, and waits no more. */
  const expectAnswered = async (answered: [Subscribed, string][]) => {
    for (const [pair, text] of answered) {
      expect((await history(pair)).map(m => m.text)).toEqual([text, 'waiting'])
      expect((await conversationRow(pair.agent.id, pair.user.id)).pendingCount).toBe(0)
    }
  }
  /** Until some backend waits on a lock the backend `pid` holds. */
  const waitingOn = (pid: number) =>
    until(async () => {
      const [row] = await ctx.deps.sql`select 1 from pg_stat_activity where ${pid} = any(pg_blocking_pids(pid))`
      return row !== undefined
    }, 5000)

  test('stores the replies whose rows are free at once; one whose row is locked waits, after', async () => {
    const [a, b] = [await subscribedPair(), await subscribedPair()]
    for (const pair of [a, b]) expect((await send(pair.user, pair.agent, 'waiting')).status).toBe(201)
    const locker = await connection()
    try {
      // As a turn applying a user's message would.
      const turn = heldOpen(locker.sql, tx => lockRow(tx, a))
      await turn.holding
      // Sent together, so they share one statement.
      const [toA, toB] = [toPair(a, 'to a'), toPair(b, 'to b')]
      expect(await within(toB)).toMatchObject({ text: 'to b' })
      // The reply to a waits for its row, in a statement of its own.
      await waitingOn(locker.pid)
      turn.release()
      await turn.result
      expect(await within(toA)).toMatchObject({ text: 'to a' })
      await expectAnswered([
        [a, 'to a'],
        [b, 'to b'],
      ])
    } finally {
      releaseHeld()
      await locker.sql.end()
    }
  }, 30_000)

  test('retries the replies it skipped one a statement: each stored once its own row is free, holding no other meanwhile (no deadlock)', async () => {
    const [x, y] = [await subscribedPair(), await subscribedPair()]
    for (const pair of [x, y]) expect((await send(pair.user, pair.agent, 'waiting')).status).toBe(201)
    const [first, second, probe] = [await connection(), await connection(), await connection()]
    try {
      const holdsX = heldOpen(first.sql, tx => lockRow(tx, x))
      const holdsY = heldOpen(second.sql, tx => lockRow(tx, y))
      await Promise.all([holdsX.holding, holdsY.holding])
      const [toX, toY] = [toPair(x, 'to x'), toPair(y, 'to y')]
      // Both skipped; the retry of x's waits for x's row.
      await waitingOn(first.pid)
      holdsX.release()
      await holdsX.result
      // x's reply is stored while y's row is still held elsewhere, and holds x's row no longer: a
      // statement of both, waiting for y holding x, would fail both.
      expect(await within(toX)).toMatchObject({ text: 'to x' })
      await probe.sql`select 1 from conversations where participant_id = ${x.agent.id} and user_id = ${x.user.id} for update nowait`
      holdsY.release()
      await holdsY.result
      expect(await within(toY)).toMatchObject({ text: 'to y' })
      await expectAnswered([
        [x, 'to x'],
        [y, 'to y'],
      ])
    } finally {
      releaseHeld()
      for (const c of [first, second, probe]) await c.sql.end()
    }
  }, 30_000)

  test('answers a reply to a free conversation while several others wait for their rows', async () => {
    const held = await Promise.all(Array.from({ length: 6 }, () => subscribedPair()))
    const free = await subscribedPair()
    for (const pair of [...held, free]) expect((await send(pair.user, pair.agent, 'waiting')).status).toBe(201)
    const locker = await connection()
    try {
      const turn = heldOpen(locker.sql, async tx => {
        for (const pair of held) await lockRow(tx, pair)
      })
      await turn.holding
      const waiting = held.map((pair, i) => toPair(pair, `held ${i}`))
      await waitingOn(locker.pid)
      // The writer's connections are few: the ones waiting must leave it one for the next batch.
      expect(await within(toPair(free, 'goes on'), 3000)).toMatchObject({ text: 'goes on' })
      turn.release()
      await turn.result
      expect(await Promise.all(waiting)).toMatchObject(held.map((_, i) => ({ text: `held ${i}` })))
    } finally {
      releaseHeld()
      await locker.sql.end()
    }
  }, 30_000)

  test('starts another statement when the one under way waits on a lock, so other replies go on', async () => {
    const [held, free] = [await subscribedPair(), await subscribedPair()]
    for (const { agent, user } of [held, free]) await send(user, agent, 'hello')
    const locker = createSql(ctx.database.url, { max: 1 })
    try {
      let blocked!: Promise<unknown>
      let freeAnswered = false
      await locker.begin(async tx => {
        await tx`select 1 from conversations where participant_id = ${held.agent.id} and user_id = ${held.user.id} for update`
        blocked = reply(held.agent, held.user.id, 'waits for the lock')
        await Bun.sleep(50)
        // The free conversation's reply is answered while the other statement still waits.
        expect((await reply(free.agent, free.user.id, 'goes on')).status).toBe(201)
        freeAnswered = true
      })
      expect(freeAnswered).toBe(true)
      expect(await blocked).toMatchObject({ status: 201 })
      expect((await history(held)).map(m => m.text)).toEqual(['waits for the lock', 'hello'])
    } finally {
      await locker.end()
    }
  })

  test('fails only the reply Postgres refuses; the others of its statement are stored', async () => {
    const pairs = await Promise.all(Array.from({ length: 3 }, () => subscribedPair()))
    for (const { agent, user } of pairs) await send(user, agent, 'hello')
    const sent = await Promise.allSettled(
      pairs.map(({ agent, user }, i) =>
        ctx.deps.replies.send({
          agentId: agent.id,
          userId: user.id,
          text: i === 1 ? 'bad \u0000 text' : `fine ${i}`,
          messageId: newRowId(),
          chosen: false,
        }),
      ),
    )
    expect(sent.map(s => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled'])
    expect((sent[1] as PromiseRejectedResult).reason).toMatchObject({ status: 400, code: 'validation_failed' })
    expect((await history(pairs[0]!)).map(m => m.text)).toEqual(['fine 0', 'hello'])
    expect((await history(pairs[1]!)).map(m => m.text)).toEqual(['hello'])
    expect((await history(pairs[2]!)).map(m => m.text)).toEqual(['fine 2', 'hello'])
    // Through the API the refusal is the client's to fix.
    expectError(
      await ctx.call('POST', '/v1/agent/conversation-reply', {
        apiKey: pairs[1]!.agent.apiKey,
        rawBody: '{"userId":"' + pairs[1]!.user.id + '","text":"a\\u0000b"}',
      }),
      400,
      'validation_failed',
    )
  })

  test('keeps a reply with a new id stored once when the Idempotency-Key replies beside it fail', async () => {
    const [fresh, keyed] = [await subscribedPair(), await subscribedPair()]
    for (const { agent, user } of [fresh, keyed]) await send(user, agent, 'hello')
    // One tick, so one batch: the keyed reply's statement is refused, the other has committed.
    const sent = await Promise.allSettled([
      ctx.deps.replies.send({ agentId: fresh.agent.id, userId: fresh.user.id, text: 'stored once', messageId: newRowId(), chosen: false }),
      ctx.deps.replies.send({ agentId: keyed.agent.id, userId: keyed.user.id, text: 'bad \u0000 text', messageId: newRowId(), chosen: true }),
    ])
    expect(sent.map(s => s.status)).toEqual(['fulfilled', 'rejected'])
    expect((sent[1] as PromiseRejectedResult).reason).toMatchObject({ status: 400 })
    expect((await history(fresh)).map(m => m.text)).toEqual(['stored once', 'hello'])
    expect((await conversationRow(keyed.agent.id, keyed.user.id)).pendingCount).toBe(1)
  })

  test('answers a stored reply whose inbox write Redis refused, and the relay writes it, though the writer never can', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'are you there?')
    expect((await inboxInRedis(pair.agent.id))[pair.user.id]).toBeDefined()
    // As for a writer whose process died after its commit: its own inbox write never lands (nothing listens on port 1).
    const redis = new Redis('redis://127.0.0.1:1', { maxRetriesPerRequest: 0, retryStrategy: () => null })
    redis.on('error', () => {})
    const sql = createSql(ctx.database.url, { max: 1 })
    const writer = createReplyWriter({ ...ctx.deps, redis, sql })
    try {
      const replied = await writer.send({ agentId: pair.agent.id, userId: pair.user.id, text: 'yes', messageId: newRowId(), chosen: false })
      expect(replied).toMatchObject({ userId: pair.user.id, text: 'yes' })
      await writer.close()
      // The reply's event, committed with it, has the relay write the conversation as Postgres holds it.
      await until(async () => (await inboxInRedis(pair.agent.id))[pair.user.id] === undefined, 10_000)
      const poll = await ctx.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })
      expect(poll.body.data.pendingConversations).toEqual([])
    } finally {
      redis.disconnect()
      await sql.end()
    }
  }, 20_000)

  test('goes on to the next statement while a stored batch waits on Redis; a conversation waits only for its own reply; close waits for it all', async () => {
    const [waiting, answered, meanwhile] = [await subscribedPair(), await subscribedPair(), await subscribedPair()]
    await send(waiting.user, waiting.agent, 'are you there?')
    for (const pair of [answered, meanwhile]) {
      await send(pair.user, pair.agent, 'hello')
      expect((await reply(pair.agent, pair.user.id, 'hi')).status).toBe(201)
    }
    expect((await inboxInRedis(waiting.agent.id))[waiting.user.id]).toBeDefined()
    const agentTexts = async (pair: Subscribed) => (await history(pair)).filter(m => m.role === 'agent').map(m => m.text)
    const within = <T>(promise: Promise<T>) => Promise.race([promise, Bun.sleep(5000).then(() => 'still waiting' as const)])
    let proxy: Awaited<ReturnType<typeof startHeldProxy>> | undefined
    let redis: Redis | undefined
    let sql: Sql | undefined
    let writer: ReturnType<typeof createReplyWriter> | undefined
    let closed = false
    try {
      proxy = await startHeldProxy(redisUrl)
      redis = new Redis(proxy.url)
      await redis.ping()
      sql = createSql(ctx.database.url, { max: 2 })
      // One statement at a time, never a second for a stalled one: only the Redis phase can overlap.
      writer = createReplyWriter({ ...ctx.deps, redis, sql, batches: 1 })
      const to = (pair: Subscribed, text: string) =>
        writer!.send({ agentId: pair.agent.id, userId: pair.user.id, text, messageId: newRowId(), chosen: false })
      proxy.hold()
      const settledOrder: string[] = []
      // One tick, so one statement: the first reply ends a pending conversation, the second one that
      // was answered; each is written answered in the inbox before it is answered, through Redis, which holds them.
      const first = to(waiting, 'yes').finally(() => settledOrder.push('yes'))
      const second = to(answered, 'more')
      await until(async () => (await conversationRow(waiting.agent.id, waiting.user.id)).pendingCount === 0, 10_000)
      // The next statement runs: another conversation's reply is stored at once.
      const third = to(meanwhile, 'and more')
      await until(async () => (await agentTexts(meanwhile)).includes('and more'), 5000)
      // The waiting conversation's next reply waits for the first one's answer.
      const again = to(waiting, 'still me').finally(() => settledOrder.push('still me'))
      await Bun.sleep(100)
      expect(await agentTexts(waiting)).toEqual(['yes'])
      const closing = writer.close().then(() => (closed = true))
      await Bun.sleep(100)
      expect([settledOrder, closed]).toEqual([[], false])
      proxy.release()
      expect(await first).toMatchObject({ text: 'yes' })
      expect(await within(second)).toMatchObject({ text: 'more' })
      expect(await within(third)).toMatchObject({ text: 'and more' })
      expect(await again).toMatchObject({ text: 'still me' })
      await closing
      expect(settledOrder).toEqual(['yes', 'still me'])
      expect(await agentTexts(waiting)).toEqual(['still me', 'yes'])
      expect((await inboxInRedis(waiting.agent.id))[waiting.user.id]).toBeUndefined()
    } finally {
      proxy?.release()
      if (writer && !closed) await writer.close()
      redis?.disconnect()
      await sql?.end()
      await proxy?.close()
    }
  }, 20_000)
})

describe('a reply while Postgres is out of reach', () => {
  test('is 503 and logs the outage as any request does, naming the route', async () => {
    const pair = await subscribedPair()
    expect((await send(pair.user, pair.agent, 'anyone?')).status).toBe(201)
    // The reply writer's own pool, through a proxy that then stops: its connection drops and new ones are refused.
    const proxy = await startHeldProxy(ctx.database.url)
    const through = new URL(ctx.database.url)
    through.port = new URL(proxy.url).port
    const sql = createSql(through.toString(), { max: 1 })
    const writer = createReplyWriter({ ...ctx.deps, sql })
    const lines: string[] = []
    const app = createApp({ ...ctx.deps, replies: writer, log: createLog('info', line => lines.push(line)) })
    try {
      await sql`select 1`
      await proxy.stop()
      const answers = [await replyThrough(app, pair, 'one'), await replyThrough(app, pair, 'two')]
      for (const answer of answers) expectError(answer, 503, 'unavailable')
      // One record per error (a dropped connection's and a refused one's may differ), each naming the route.
      const records = lines.map(line => JSON.parse(line))
      expect(records.length).toBeGreaterThan(0)
      for (const record of records) {
        expect([record.level, record.msg, record.route]).toEqual(['error', 'backing service unavailable', '/v1/agent/conversation-reply'])
        expect(record.code).toBeString()
      }
      expect((await history(pair)).map(message => message.text)).toEqual(['anyone?'])
    } finally {
      await writer.close()
      await sql.end()
      await proxy.close()
    }
  }, 20_000)
})

describe('two processes’ replies to one conversation', () => {
  test('the one that finds it answered by the other, whose inbox write is still on its way, leaves it answered before it is answered', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'anyone?')
    const poll = () => ctx.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })
    // The agent has polled: its inbox is built, and read from Redis from now on.
    expect((await poll()).body.data.pendingConversations).toHaveLength(1)
    // Another API process's reply writer, whose Redis writes wait in a proxy.
    const proxy = await startHeldProxy(redisUrl)
    const redis = new Redis(proxy.url)
    const sql = createSql(ctx.database.url, { max: 2 })
    const other = createReplyWriter({ ...ctx.deps, redis, sql })
    try {
      await redis.ping()
      proxy.hold()
      const first = other.send({ agentId: pair.agent.id, userId: pair.user.id, text: 'me first', messageId: newRowId(), chosen: false })
      await until(async () => (await conversationRow(pair.agent.id, pair.user.id)).pendingCount === 0, 10_000)
      // The first reply has ended the pending state; its inbox write has not landed.
      const second = await reply(pair.agent, pair.user.id, 'and me')
      expect(second.status).toBe(201)
      expect((await poll()).body.data.pendingConversations).toEqual([])
      expect((await inboxInRedis(pair.agent.id))[pair.user.id]).toBeUndefined()
      proxy.release()
      expect(await first).toMatchObject({ text: 'me first' })
      // The first write, older, lands late and changes nothing.
      expect((await inboxInRedis(pair.agent.id))[pair.user.id]).toBeUndefined()
    } finally {
      proxy.release()
      await other.close()
      redis.disconnect()
      await sql.end()
      await proxy.close()
    }
  }, 20_000)
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
    const context = { actor: `agent:${pair.agent.id}`, id: pair.agent.id, commandId: 'lost', at: new Date() }
    for (const type of ['user.message', 'service.request', 'service.respond']) expect(agent[type]!.repair).toBeFunction()
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

describe('a reply after the subscription ended', () => {
  test('answers a message sent while subscribed, once; then, with nothing waiting, is 403 not_subscribed', async () => {
    const pair = await subscribedPair()
    expect((await send(pair.user, pair.agent, 'one last question')).status).toBe(201)
    const [subscription] = await ctx.deps.sql<{ id: string }[]>`
      select id from subscriptions where user_id = ${pair.user.id} and participant_id = ${pair.agent.id}
    `
    expect((await ctx.call('DELETE', `/v1/billing/subscriptions/${subscription!.id}`, { token: pair.user.token })).status).toBeLessThan(300)
    expect((await reply(pair.agent, pair.user.id, 'the answer')).status).toBe(201)
    expectError(await reply(pair.agent, pair.user.id, 'and one more thing'), 403, 'not_subscribed')
    // Under an Idempotency-Key too (the statement for chosen ids).
    expectError(await reply(pair.agent, pair.user.id, 'keyed', { 'idempotency-key': `after-${newRowId()}` }), 403, 'not_subscribed')
    expect((await history(pair)).map(m => m.text)).toEqual(['the answer', 'one last question'])
  })

  test('to a user who never wrote is 404; a subscriber with nothing waiting may still be written to', async () => {
    const pair = await subscribedPair()
    expectError(await reply(pair.agent, pair.user.id, 'hello?'), 404, 'not_found')
    expect((await send(pair.user, pair.agent, 'hi')).status).toBe(201)
    expect((await reply(pair.agent, pair.user.id, 'hello')).status).toBe(201)
    expect((await reply(pair.agent, pair.user.id, 'and a follow-up')).status).toBe(201)
  })

  test('to a subscriber whose first message commits just after the reply’s statement ran is stored, not 403', async () => {
    const pair = await subscribedPair()
    // The reply's statement finds no conversation (the user's first message not yet committed); the
    // message commits before the reason is read, which then finds a conversation open to a reply.
    let first = true
    const replies: ReplyWriter = {
      async send(r) {
        const replied = await ctx.deps.replies.send(r)
        if (first) expect((await send(pair.user, pair.agent, 'my first question')).status).toBe(201)
        first = false
        return replied
      },
      close: () => ctx.deps.replies.close(),
    }
    const replied = await replyAsAgent({ ...ctx.deps, replies }, pair.agent.id, { userId: pair.user.id, text: 'welcome' }, {})
    expect(replied.text).toBe('welcome')
    expect((await history(pair)).map(m => m.text)).toEqual(['welcome', 'my first question'])
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

describe('a process’s own inbox changes', () => {
  /**
   * A process of its own: its pub/sub, its poll's reader (on `readerSql`, else the context's pool)
   * and its reply writer; `close` ends them all.
   */
  async function ownProcess(readerSql?: Sql) {
    const subscriber = new Redis(redisUrl)
    const pubsub = createPubSub(subscriber)
    const inboxes = await createInboxReader({ ...ctx.deps, pubsub, sql: readerSql ?? ctx.deps.sql })
    const sql = createSql(ctx.database.url, { max: 2 })
    const replies = createReplyWriter({ ...ctx.deps, pubsub, sql })
    const close = async () => {
      await replies.close()
      await inboxes.close()
      await pubsub.close()
      await sql.end()
    }
    return { subscriber, pubsub, inboxes, replies, close }
  }

  test('reach its next poll before their announcement comes back through Redis: a user’s message, then the reply', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'first')
    // A process of its own; its turns' handlers too, below.
    const { subscriber, pubsub, inboxes, replies, close } = await ownProcess()
    try {
      const latest = async () => (await inboxes.read(pair.agent.id)).conversations.map(c => c.latestMessage)
      // Read once: listening, and held in memory.
      expect(await latest()).toEqual(['first'])
      // From now on Redis sends this process no announcement: only what it tells itself reaches the reader.
      await subscriber.unsubscribe(ctx.deps.keys.channels.inboxChanged)
      const handler = actorKinds({ ...ctx.deps, pubsub }).agent!['user.message']!
      const context = { actor: `agent:${pair.agent.id}`, id: pair.agent.id, commandId: newRowId(), at: new Date() }
      const payload = { messageId: newRowId(), userId: pair.user.id, text: 'second' }
      const applied = await ctx.deps.sql.begin(tx => handler.apply(tx, payload, context))
      await handler.project!(applied, payload, context)
      expect(await latest()).toEqual(['second'])
      await replies.send({ agentId: pair.agent.id, userId: pair.user.id, text: 'answered', messageId: newRowId(), chosen: false })
      expect(await latest()).toEqual([])
    } finally {
      await close()
    }
  })

  test('reach its next poll when another process wrote the same answer first, its announcement still on its way', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'first')
    const { subscriber, inboxes, replies, close } = await ownProcess()
    try {
      const latest = async () => (await inboxes.read(pair.agent.id)).conversations.map(c => c.latestMessage)
      // Read until held in memory (a read that overlapped an announcement is not kept).
      await until(async () => (await latest())[0] === 'first' && inboxes.peek(pair.agent.id) !== undefined)
      await subscriber.unsubscribe(ctx.deps.keys.channels.inboxChanged)
      // The reply's version, written answered first by another process (the outbox relay delivering
      // the reply's event, say) whose announcement has not reached this one: the writer's own write
      // then changes nothing, yet this process's copy is older than what Redis holds.
      const [row] = await ctx.deps.sql`select version from conversations where participant_id = ${pair.agent.id} and user_id = ${pair.user.id}`
      const elsewhere = { ...ctx.deps, pubsub: { deliver: () => {} } }
      await writeConversation(elsewhere, pair.agent.id, pair.user.id, Number(row!.version) + 1, null)
      await replies.send({ agentId: pair.agent.id, userId: pair.user.id, text: 'answered', messageId: newRowId(), chosen: false })
      expect(await latest()).toEqual([])
    } finally {
      await close()
    }
  })

  test('reach a poll that comes after them while a rebuild that read before them is under way', async () => {
    const pair = await subscribedPair()
    await send(pair.user, pair.agent, 'first')
    // Its reader on connections of its own, with no lock timeout: the rebuild held on the table waits for it, however loaded the machine.
    const readerSql = createSql(ctx.database.url, { max: 4 })
    const { inboxes, replies, close } = await ownProcess(readerSql)
    // The rebuild's read of the open requests waits here, after it read (and wrote) the conversations.
    let unlock!: () => void
    const unlocked = new Promise<void>(resolve => (unlock = resolve))
    let locked!: () => void
    const holding = new Promise<void>(resolve => (locked = resolve))
    const lock = ctx.deps.sql.begin(async tx => {
      await tx`lock table service_requests in access exclusive mode`
      locked()
      await unlocked
    })
    try {
      await holding
      await ctx.deps.redis.del(ctx.deps.keys.agent(pair.agent.id).built)
      const first = inboxes.read(pair.agent.id)
      const versions = ctx.deps.keys.agent(pair.agent.id).versions
      // Held on the table, the rebuild has begun (emptied the inbox, versions too); written again,
      // the conversation was read before the reply below.
      await lockWaited(ctx.deps.sql)
      await until(async () => (await ctx.deps.redis.hget(versions, pair.user.id)) !== null)
      await replies.send({ agentId: pair.agent.id, userId: pair.user.id, text: 'answered', messageId: newRowId(), chosen: false })
      // The agent polls after its reply was answered: it must not be shown the conversation pending.
      const next = inboxes.read(pair.agent.id)
      unlock()
      await first
      expect((await next).conversations.map(c => c.latestMessage)).toEqual([])
      expect((await inboxes.read(pair.agent.id)).conversations).toEqual([])
    } finally {
      unlock()
      await lock
      await close()
      await readerSql.end()
    }
  })
})

describe('an agent deactivated while a user’s message waits in its mailbox', () => {
  let idle: TestContext
  beforeAll(async () => {
    idle = await createTestContext({ actors: false, relay: false })
  })
  afterAll(() => idle.close())

  /** A message checked by the route and queued: no runtime applies it yet. */
  async function queued() {
    const agentOwner = await signUp(idle)
    const pair = await newPair(idle, agentOwner)
    const sent = idle.call('POST', `/v1/conversations/${pair.agent.id}/messages`, { token: pair.user.token, body: { text: 'are you there?' } })
    const mailbox = idle.deps.keys.actor(`agent:${pair.agent.id}`).mailbox
    await until(async () => (await idle.deps.redis.xlen(mailbox)) === 1)
    return { pair, agentOwner, sent }
  }

  /** Applies what waits, then checks the message was refused and left nothing behind. */
  async function expectRefused({ agent }: Subscribed, sent: ReturnType<typeof idle.call>, meanwhile: () => Promise<void> = async () => {}) {
    const runtime = await startActors(idle.deps, { leaseMs: 2000 })
    try {
      await meanwhile()
      expectError(await sent, 404, 'not_found')
    } finally {
      await runtime.stop()
    }
    const stored = await idle.deps.sql`select count(*)::int as n from messages where participant_id = ${agent.id}`
    expect(stored[0]!.n).toBe(0)
    const told = await idle.deps.sql`select count(*)::int as n from outbox where type = 'conversation.message' and data like ${`%${agent.id}%`}`
    expect(told[0]!.n).toBe(0)
    expect(await idle.deps.redis.exists(idle.deps.keys.agent(agent.id).inbox)).toBe(0)
  }

  test('deactivated before it is applied: 404, nothing stored, its owner told nothing, its inbox left forgotten', async () => {
    const { pair, agentOwner, sent } = await queued()
    expect((await idle.call('DELETE', `/v1/participants/${pair.agent.id}`, { token: agentOwner.token })).status).toBe(200)
    await expectRefused(pair, sent)
  })

  test('deactivated as it is applied: the message waits for the deactivation, then is refused', async () => {
    const { pair, agentOwner, sent } = await queued()
    const held = await holdDeactivation(idle.deps.sql, { id: pair.agent.id, ownerId: agentOwner.id })
    await expectRefused(pair, sent, () => held.commitOnceWaited())
  })
})

describe('an agent deactivated as it works (by another process, whose eviction of its key is on its way)', () => {
  // No relay: the deactivation's revocation reaches this process only once the test says so, as
  // another process's does once its announcement arrives.
  let here: TestContext
  beforeAll(async () => {
    here = await createTestContext({ actors: true, relay: false })
  })
  afterAll(() => here.close())

  /** A message waiting for the agent's reply, and the agent's key cached here by a poll. */
  async function waiting() {
    const agentOwner = await signUp(here)
    const pair = await newPair(here, agentOwner)
    const sent = await here.call('POST', `/v1/conversations/${pair.agent.id}/messages`, { token: pair.user.token, body: { text: 'still there?' } })
    expect(sent.status).toBe(201)
    const polled = await here.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })
    expect(polled.body.data.pendingConversations).toHaveLength(1)
    return { pair, agentOwner }
  }

  /** The deactivation as another process's DELETE makes it: the row locked, the change committed, the inbox forgotten. */
  async function deactivate({ agent }: Subscribed, ownerId: string) {
    await here.deps.sql.begin(async tx => {
      await tx`select 1 from participants where id = ${agent.id} for update`
      await deactivateAgent(tx, agent.id, ownerId, here.clock.now())
    })
    await here.deps.inboxes.forget(agent.id)
  }

  /** The reply was refused and left nothing behind: no message, no event for the user, no inbox in Redis. */
  async function expectRefused({ agent }: Subscribed, replied: Promise<Awaited<ReturnType<typeof here.call>>>) {
    expectError(await replied, 401, 'invalid_token')
    const [stored] = await here.deps.sql`select count(*)::int as n from messages where participant_id = ${agent.id} and role = 'agent'`
    expect(stored!.n).toBe(0)
    const [told] = await here.deps.sql`select count(*)::int as n from outbox where type = 'conversation.reply' and data like ${`%${agent.id}%`}`
    expect(told!.n).toBe(0)
    const k = here.deps.keys.agent(agent.id)
    expect(await here.deps.redis.exists(k.inbox, k.versions)).toBe(0)
  }

  const replyHere = ({ agent, user }: Subscribed) =>
    here.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: 'yes' } })

  test('deactivated before the reply: its key, still cached here, stores nothing (401 invalid_token)', async () => {
    const { pair, agentOwner } = await waiting()
    await deactivate(pair, agentOwner.id)
    await expectRefused(pair, replyHere(pair))
  })

  test('its poll, its key still cached here, does not build the forgotten inbox again (401 invalid_token)', async () => {
    const { pair, agentOwner } = await waiting()
    await deactivate(pair, agentOwner.id)
    expectError(await here.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey }), 401, 'invalid_token')
    expectError(await here.call('GET', '/v1/agent/status', { apiKey: pair.agent.apiKey }), 401, 'invalid_token')
    const k = here.deps.keys.agent(pair.agent.id)
    expect(await here.deps.redis.exists(k.inbox, k.versions, k.built, k.requests)).toBe(0)
  })

  test('a reply stored just before: its event, relayed after the deactivation, leaves the forgotten inbox forgotten', async () => {
    const { pair, agentOwner } = await waiting()
    expect((await replyHere(pair)).status).toBe(201)
    expect((await here.call('DELETE', `/v1/participants/${pair.agent.id}`, { token: agentOwner.token })).status).toBe(200)
    const k = here.deps.keys.agent(pair.agent.id)
    expect(await here.deps.redis.exists(k.inbox, k.versions, k.built)).toBe(0)
    // The workers' relay, a pass late: the user still hears the reply.
    await relayPass({ ...here.deps, effects: relayEffects(here.deps) }, 500)
    const [left] = await here.deps.sql`select count(*)::int as n from outbox where type = 'conversation.reply' and data like ${`%${pair.agent.id}%`}`
    expect(left!.n).toBe(0)
    expect(await here.deps.redis.exists(k.inbox, k.versions, k.built)).toBe(0)
  })

  /** The relay's deps with its inbox writes held back once it has read the conversations, as a pass under load (or a Redis that hangs) holds them. */
  function heldInboxWrites() {
    let letThrough!: () => void
    const gate = new Promise<void>(resolve => (letThrough = resolve))
    let reached!: () => void
    const writing = new Promise<void>(resolve => (reached = resolve))
    const redis = new Proxy(here.deps.redis, {
      get(target, name) {
        const value = Reflect.get(target, name) as unknown
        if (typeof value !== 'function') return value
        if (name !== 'evalsha') return value.bind(target)
        return async (...args: unknown[]) => {
          if (String(args[2]).endsWith(':inbox')) {
            reached()
            await gate
          }
          return value.apply(target, args)
        }
      },
    })
    return { deps: { ...here.deps, redis, effects: relayEffects({ ...here.deps, redis }) }, writing, letThrough }
  }

  test('a reply’s event relayed as the agent is deactivated: the inbox write lands before the forgetting, or is forgotten after it', async () => {
    const { pair, agentOwner } = await waiting()
    expect((await replyHere(pair)).status).toBe(201)
    const held = heldInboxWrites()
    const relayed = relayPass(held.deps, 500)
    try {
      await held.writing
      const deactivated = here.call('DELETE', `/v1/participants/${pair.agent.id}`, { token: agentOwner.token })
      await Promise.race([deactivated, lockWaited(here.deps.sql)])
      held.letThrough()
      expect((await relayed)?.error).toBeUndefined()
      expect((await deactivated).status).toBe(200)
    } finally {
      held.letThrough()
    }
    const k = here.deps.keys.agent(pair.agent.id)
    expect(await here.deps.redis.exists(k.inbox, k.versions, k.built)).toBe(0)
  })

  test('a reply’s event relayed as the agent is deactivated: the deactivation does not wait for the relay’s Redis', async () => {
    const { pair, agentOwner } = await waiting()
    expect((await replyHere(pair)).status).toBe(201)
    const held = heldInboxWrites()
    const relayed = relayPass(held.deps, 500)
    try {
      await held.writing
      // Redis hanging under the relay's write (up to its command timeout, again each pass) must not
      // hold the owner's deactivation: it answers, waiting on no lock, while the write is still held.
      let answered = false
      const deactivated = here.call('DELETE', `/v1/participants/${pair.agent.id}`, { token: agentOwner.token }).finally(() => (answered = true))
      await until(
        async () =>
          answered ||
          (await here.deps.sql`select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`).length > 0,
        20_000,
      )
      expect(answered).toBe(true)
      expect((await deactivated).status).toBe(200)
      held.letThrough()
      expect((await relayed)?.error).toBeUndefined()
    } finally {
      held.letThrough()
      await relayed
    }
    // The write landed after the forgetting: the relay forgets the inbox again once it has.
    const k = here.deps.keys.agent(pair.agent.id)
    expect(await here.deps.redis.exists(k.inbox, k.versions, k.built)).toBe(0)
    const [left] = await here.deps.sql`select count(*)::int as n from outbox where type = 'conversation.reply' and data like ${`%${pair.agent.id}%`}`
    expect(left!.n).toBe(0)
  })

  test('deactivated while the reply waits for its conversation’s row: refused once the row is free', async () => {
    const { pair, agentOwner } = await waiting()
    let release = () => {}
    const held = new Promise<void>(resolve => (release = resolve))
    let locked = () => {}
    const isLocked = new Promise<void>(resolve => (locked = resolve))
    // Another transaction on the conversation's row (a turn applying a message, say), open until released.
    const holding = here.deps.sql.begin(async tx => {
      await tx`select 1 from conversations where participant_id = ${pair.agent.id} and user_id = ${pair.user.id} for update`
      locked()
      await held
    })
    await isLocked
    const replied = replyHere(pair)
    const waitingOnLock = async () =>
      (await here.deps.sql`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()`)[0]!.n ===
      1
    await until(waitingOnLock)
    await deactivate(pair, agentOwner.id)
    release()
    await holding
    await expectRefused(pair, replied)
  })
})
