/** Rebuilding agents' inboxes after Redis lost them: bounded per process, every poll answered or told when to retry. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Redis } from 'ioredis'
import { createSql, type Sql } from '../src/db.ts'
import { AppError } from '../src/errors.ts'
import { createInboxReader, type InboxReader } from '../src/conversations/inbox-reader.ts'
import { invalidateInbox, rebuildPageSize } from '../src/conversations/inbox.ts'
import { seedAgents, seedWaitingConversations, type SeededAgent } from '../bench/lib/seed-agents.ts'
import { createAgent, createTestContext, signUp, subscribedPair, type TestContext } from './helpers/context.ts'
import { startActorRuntime } from '../src/actors/runtime.ts'
import { actorKinds } from '../src/deps.ts'
import { newRowId } from '../src/ids.ts'
import { lockWaited } from './helpers/deactivation.ts'
import { holdOpen } from './helpers/held-transaction.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let agents: SeededAgent[]

beforeAll(async () => {
  // No lock timeout: rebuilds held on a lock by a test wait for it, however loaded the machine.
  ctx = await createTestContext({ relay: false, env: { DATABASE_LOCK_TIMEOUT_MS: '0' } })
  agents = await seedAgents(ctx.deps.sql, { agents: 1000, pendingEvery: 10, repliers: 0 })
})
afterAll(() => ctx.close())

/** Every key of the test's prefix gone at one instant, as when Redis restarts empty (one DEL: a deletion in steps would not be). */
async function loseEverything() {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, keys] = await ctx.deps.redis.scan(cursor, 'MATCH', `${ctx.config.redisPrefix}*`, 'COUNT', 10_000)
    cursor = next
    found.push(...keys)
  } while (cursor !== '0')
  expect(found.length).toBeGreaterThan(1000)
  await ctx.deps.redis.del(...found)
}

/** The same connections, counting the statements in flight at once (a rebuild runs two). */
function counting(sql: Sql) {
  const seen = { inFlight: 0, peak: 0 }
  const counted = new Proxy(sql, {
    apply(target, self, args) {
      const query = Reflect.apply(target, self, args) as Promise<unknown>
      seen.inFlight++
      seen.peak = Math.max(seen.peak, seen.inFlight)
      query.then(
        () => seen.inFlight--,
        () => seen.inFlight--,
      )
      return query
    },
  })
  return { sql: counted, seen }
}

/** The same connections, each statement's answer held back until `letThrough` (counting the statements sent). */
function holding(sql: Sql) {
  let letThrough!: () => void
  const gate = new Promise<void>(resolve => (letThrough = resolve))
  const held = { statements: 0 }
  const holdingSql = new Proxy(sql, {
    apply(target, self, args) {
      const query = Reflect.apply(target, self, args) as Promise<unknown>
      held.statements++
      return gate.then(() => query)
    },
  })
  return { sql: holdingSql, held, letThrough }
}

describe('inboxes rebuilt after Redis lost them, 1,000 agents polling', () => {
  test('run a few at a time; polls beyond the line are 503 with Retry-After; every inbox comes back as Postgres has it', async () => {
    const { sql, seen } = counting(ctx.deps.sql)
    // No memory cache (ttl 0): every poll reads Redis, as processes do once their copies lapse.
    const reader: InboxReader = await createInboxReader({ ...ctx.deps, sql, ttlMs: 0, rebuilds: 4, waitingRebuilds: 100 })
    try {
      const refused: AppError[] = []
      const polled = new Map<string, number>()
      /** Each agent polls `rounds` times (and for as long as `more()` says); a refused poll waits and polls again. */
      const pollAll = (rounds: number, more = () => false) =>
        Promise.all(
          agents.map(async agent => {
            for (let round = 0; round < rounds || more();) {
              try {
                polled.set(agent.id, (await reader.read(agent.id)).conversations.length)
                round++
              } catch (error) {
                if (!(error instanceof AppError)) throw error
                refused.push(error)
                await Bun.sleep(20)
              }
            }
          }),
        )

      await pollAll(1)
      const built = seen.peak
      // Redis loses everything while the agents poll on (however long the deletion takes).
      let deleted = false
      const polling = pollAll(2, () => !deleted)
      await Bun.sleep(5)
      await loseEverything()
      deleted = true
      await polling
      await pollAll(1)

      expect(built).toBeLessThanOrEqual(8)
      expect(seen.peak).toBeLessThanOrEqual(8)
      expect(refused.length).toBeGreaterThan(0)
      const told = (error: AppError) => error.status === 503 && error.code === 'unavailable' && error.headers?.['retry-after'] === '1'
      expect(refused.filter(error => !told(error))).toEqual([])
      for (const agent of agents) expect(polled.get(agent.id)).toBe(agent.pending ? 1 : 0)
      const builtMarkers = await Promise.all(agents.map(agent => ctx.deps.redis.exists(ctx.deps.keys.agent(agent.id).built)))
      expect(builtMarkers.every(marker => marker === 1)).toBe(true)
    } finally {
      await reader.close()
    }
  }, 60_000)
})

describe('an agent with more conversations than one step of a rebuild writes', () => {
  test('is rebuilt in steps of at most rebuildPageSize conversations each, under a hold renewed while they run', async () => {
    const agent = agents[3]!
    await seedWaitingConversations(ctx.deps.sql, [agent], 2 * rebuildPageSize + 500)
    const [row] = await ctx.deps.sql<{ count: number }[]>`
      select count(*)::int as count from conversations where participant_id = ${agent.id} and pending_count > 0
    `
    const count = row!.count
    // The arguments of each script call that writes conversations, and a wait after each longer than
    // half the hold's lease: in one call (every conversation an agent ever had) a rebuild held Redis
    // for seconds at 200,000 and could not be sent at 1,000,000; in steps, unrenewed, the lease ran out.
    const steps: number[] = []
    const redis = new Proxy(ctx.deps.redis, {
      get(target, name) {
        const value = Reflect.get(target, name) as unknown
        if (typeof value !== 'function') return value
        if (name !== 'evalsha') return value.bind(target)
        return async (...args: unknown[]) => {
          const result = await value.apply(target, args)
          if (String(args[2]).endsWith(':inbox')) {
            steps.push(args.length)
            await Bun.sleep(200)
          }
          return result
        }
      },
    })
    const reader = await createInboxReader({ ...ctx.deps, redis, ttlMs: 0, holdMs: 300 })
    try {
      await invalidateInbox(ctx.deps, agent.id)
      expect((await reader.read(agent.id)).conversations).toHaveLength(count)
      // Three steps of at most rebuildPageSize conversations: the script's SHA, its key count and three keys, the holder, three arguments each.
      expect(steps).toHaveLength(3)
      expect(Math.max(...steps)).toBe(6 + 3 * rebuildPageSize)
      const k = ctx.deps.keys.agent(agent.id)
      expect(await ctx.deps.redis.exists(k.built)).toBe(1)
      expect(await ctx.deps.redis.hlen(k.inbox)).toBe(count)
      expect((await reader.read(agent.id)).conversations).toHaveLength(count)
      expect(steps).toHaveLength(3)
    } finally {
      await reader.close()
    }
  })
})

describe('an inbox Redis brought back older than it was', () => {
  test('where INFO is refused (an ACL), inboxes are read and rebuilt all the same, never an error', async () => {
    const redis = await startRedisServer()
    const admin = new Redis(redis.url)
    await admin.call('ACL', 'SETUSER', 'app', 'on', '>app-secret', '~*', '&*', '+@all', '-info')
    const url = new URL(redis.url)
    url.username = 'app'
    url.password = 'app-secret'
    const own = await createTestContext({ actors: true, env: { REDIS_URL: url.toString() } })
    try {
      expect(await own.deps.redis.info('server').catch((error: Error) => error.message)).toStartWith('NOPERM')
      const { agent, user } = await subscribedPair(own, await signUp(own))
      const poll = () => own.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })
      expect((await poll()).status).toBe(200)
      expect((await own.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hi' } })).status).toBe(201)
      await until(async () => (await poll()).body.data.pendingConversations.length === 1, 5000)
      // Marked for a rebuild, rebuilt at the next poll, and marked '1': no server's run id is known.
      await invalidateInbox(own.deps, agent.id)
      await until(async () => (await poll()).body.data.pendingConversations.length === 1, 5000)
      expect(await own.deps.redis.get(own.deps.keys.agent(agent.id).built)).toBe(`1/${own.deps.database.current()}`)
      expect((await poll()).body.data.pendingConversations).toHaveLength(1)
    } finally {
      await own.close()
      admin.disconnect()
      await redis.close()
    }
  }, 60_000)

  test('a restarted or failed-over server holding an older copy shows a message acknowledged since: the inbox is rebuilt', async () => {
    const redis = await startRedisServer()
    const own = await createTestContext({ actors: true, env: { REDIS_URL: redis.url } })
    try {
      const { agent, user } = await subscribedPair(own, await signUp(own))
      const poll = async () => (await own.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).body.data.pendingConversations as unknown[]
      expect(await poll()).toEqual([])
      // The copy a replica or a snapshot still holds: the inbox as built, before the message.
      const k = own.deps.keys.agent(agent.id)
      const names = [k.inbox, k.versions, k.requests, k.built]
      const copies = await Promise.all(names.map(name => own.deps.redis.dumpBuffer(name)))
      const sent = await own.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'are you there?' } })
      expect(sent.status).toBe(201)
      expect(await poll()).toHaveLength(1)

      // Another server (a restart; a failover would be another machine) with the older copy.
      await redis.restart({ keepData: true, downMs: 100 })
      await until(async () => (await own.deps.redis.ping().catch(() => '')) === 'PONG', 10_000)
      await own.deps.redis.del(...names)
      for (const [i, copy] of copies.entries()) if (copy) await own.deps.redis.restore(names[i]!, 0, copy, 'REPLACE')
      expect(await own.deps.redis.hlen(k.inbox)).toBe(0)

      await until(async () => (await poll().catch(() => [])).length === 1, 10_000)
      // Shown by a rebuild from Postgres, marked with the new server's run id (not from memory).
      const runId = /run_id:(\w+)/.exec(await own.deps.redis.info('server'))![1]
      expect(await own.deps.redis.get(k.built)).toBe(`${runId}/${own.deps.database.current()}`)
      expect(await own.deps.redis.hlen(k.inbox)).toBe(1)
    } finally {
      await own.close()
      await redis.close()
    }
  }, 60_000)
})

describe('a rebuild whose take of the actor fails', () => {
  test('answers the poll from Postgres, lets go, and marks mail that waits in the mailbox due at once', async () => {
    const { redis, keys } = ctx.deps
    const agent = agents[1]!
    const actor = `agent:${agent.id}`
    // The fencing counter holds no number: the take fails after taking the lease. Mail waits, unmarked.
    await redis.set(keys.actor(actor).fence, 'not a number')
    await redis.xadd(keys.actor(actor).mailbox, '*', 'type', 'none')
    try {
      await invalidateInbox(ctx.deps, agent.id)
      const polled = await ctx.call('GET', '/v1/agent/events', { apiKey: agent.key })
      expect(polled.status).toBe(200)
      expect(polled.body.data.pendingConversations).toHaveLength(agent.pending ? 1 : 0)
      await until(async () => (await redis.zscore(keys.actorsDue, actor)) !== null, 2000)
      expect(Number(await redis.zscore(keys.actorsDue, actor))).toBeLessThanOrEqual(Date.now() + 100)
      expect(await redis.exists(keys.actor(actor).lease)).toBe(0)
    } finally {
      await redis.del(keys.actor(actor).fence, keys.actor(actor).mailbox)
      await redis.zrem(keys.actorsDue, actor)
    }
  })
})

describe('a poll while the line of rebuilds is full', () => {
  test('is refused without reading Redis; a poll of the agent being rebuilt joins its rebuild', async () => {
    const [rebuilt, other] = [agents[5]!, agents[6]!]
    // Postgres answers the rebuild only when let through, so it stays under way while the others poll.
    const { sql, held, letThrough } = holding(ctx.deps.sql)
    // Reads of an inbox from Redis (one MULTI each), counted.
    const reads = { count: 0 }
    const redis = new Proxy(ctx.deps.redis, {
      get(target, name) {
        const value = Reflect.get(target, name) as unknown
        if (typeof value !== 'function') return value
        if (name === 'multi') reads.count++
        return value.bind(target)
      },
    })
    const reader = await createInboxReader({ ...ctx.deps, sql, redis, ttlMs: 0, rebuilds: 1, waitingRebuilds: 0 })
    try {
      for (const agent of [rebuilt, other]) await invalidateInbox(ctx.deps, agent.id)
      const first = reader.read(rebuilt.id)
      await until(async () => held.statements > 0)
      const readsBefore = reads.count
      const refusal = await reader.read(other.id).catch((error: unknown) => error)
      expect(refusal).toBeInstanceOf(AppError)
      expect((refusal as AppError).status).toBe(503)
      expect((refusal as AppError).headers?.['retry-after']).toBe('1')
      const again = reader.read(rebuilt.id)
      letThrough()
      expect((await first).conversations).toHaveLength(rebuilt.pending ? 1 : 0)
      expect(await again).toEqual(await first)
      expect(reads.count).toBe(readsBefore)
      expect((await reader.read(other.id)).conversations).toHaveLength(other.pending ? 1 : 0)
    } finally {
      await reader.close()
    }
  })
})

describe('rebuilds at once by default', () => {
  test('64 run side by side while Postgres is slow to answer; with none waiting, the rest are refused', async () => {
    const polled = agents.slice(100, 200)
    const { sql, held, letThrough } = holding(ctx.deps.sql)
    // Under full load every call of a rebuild waits its turn in a busy process: only many side by
    // side keep up (8 at once rebuilt 15 to 400 inboxes a second after Redis lost them, bench/notes.md).
    const reader = await createInboxReader({ ...ctx.deps, sql, ttlMs: 0, waitingRebuilds: 0 })
    try {
      for (const agent of polled) await invalidateInbox(ctx.deps, agent.id)
      let refused = 0
      const polls = polled.map(agent =>
        reader.read(agent.id).catch((error: unknown) => {
          if (!(error instanceof AppError) || error.status !== 503) throw error
          refused++
          return null
        }),
      )
      // Each rebuild first asks whether its agent is still active, one statement, held here.
      await until(async () => refused + held.statements === polled.length)
      expect(held.statements).toBe(64)
      expect(refused).toBe(polled.length - 64)
      letThrough()
      const answered = (await Promise.all(polls)).filter(inbox => inbox !== null)
      expect(answered).toHaveLength(64)
    } finally {
      await reader.close()
    }
  })
})

describe('a rebuild while a holder paused past its lease applies a service request', () => {
  // On a connection of its own: one of the pool would take the place of the statement it looks for.
  let watch: Sql
  beforeAll(() => void (watch = createSql(ctx.database.url, { max: 1 })))
  afterAll(() => watch.end())
  const seen = async (condition: string) =>
    (await watch.unsafe(`select 1 from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() and ${condition}`)).length > 0

  test('leaves the request that holder committed in the inbox, not the requests it read before', async () => {
    const { redis, keys } = ctx.deps
    const owner = await signUp(ctx)
    const [from, target] = [await createAgent(ctx, owner), await createAgent(ctx, owner)]
    const actor = `agent:${target.id}`
    const requests = keys.agent(target.id).requests
    // The paused holder: a runtime whose connections wait for locks as long as they are held.
    const sql = createSql(ctx.database.url, { max: 2 })
    let projected!: () => void
    const projection = new Promise<void>(resolve => (projected = resolve))
    const paused = await startActorRuntime({
      ...ctx.deps,
      sql,
      kinds: actorKinds(ctx.deps),
      leaseMs: 600,
      beforeAck: () => projected(),
    })
    // The target's row held: the request's turn, fenced in, waits inside its transaction.
    const unlockTarget = await holdOpen(ctx.deps.sql, tx => tx`select 1 from participants where id = ${target.id} for update`)
    let unlockConversations = async () => {}
    try {
      const requestId = newRowId()
      await ctx.deps.dispatcher.tell(actor, 'service.request', {
        requestId,
        fromAgentId: from.id,
        fromAgentName: from.name,
        serviceTag: null,
        input: 'x',
      })
      await lockWaited(ctx.deps.sql)
      // Paused: its lease runs out mid-turn.
      paused.abandon()
      await until(async () => (await redis.exists(keys.actor(actor).lease)) === 0)
      // The poll's rebuild takes the actor and reads the open requests, then waits to read the conversations.
      unlockConversations = await holdOpen(ctx.deps.sql, tx => tx`lock table conversations in access exclusive mode`)
      await redis.del(keys.agent(target.id).built)
      const polled = ctx.call('GET', '/v1/agent/events', { apiKey: target.apiKey })
      await until(
        async () =>
          (await seen(`state = 'idle' and query like '%r.target_participant_id%'`)) ||
          (await seen(`wait_event_type = 'Lock' and query like '%actor_fences%'`)),
      )
      // The paused holder resumes: commits the request and projects it into the inbox being rebuilt.
      await unlockTarget()
      await projection
      await unlockConversations()
      expect((await polled).status).toBe(200)
      const [stored] = await ctx.deps.sql<{ status: string }[]>`select status from service_requests where id = ${requestId}`
      expect(stored?.status).toBe('pending')
      expect(await redis.hexists(requests, requestId)).toBe(1)
      const again = await ctx.call('GET', '/v1/agent/events', { apiKey: target.apiKey })
      expect(again.body.data.serviceRequests.map((r: { requestId: string }) => r.requestId)).toEqual([requestId])
    } finally {
      await unlockTarget().catch(() => {})
      await unlockConversations().catch(() => {})
      await sql.end()
    }
  })
})

describe('a rebuild on a Postgres that refuses writes (it cannot fence the actor)', () => {
  test('answers the poll from it and leaves Redis alone', async () => {
    const agent = agents.find(a => a.pending)!
    const readOnly = createSql(ctx.database.url, { max: 2, settings: { default_transaction_read_only: 'on' } })
    const inboxes = await createInboxReader({ ...ctx.deps, sql: readOnly })
    try {
      await invalidateInbox(ctx.deps, agent.id)
      expect((await inboxes.read(agent.id)).conversations).toHaveLength(1)
      expect(await ctx.deps.redis.exists(ctx.deps.keys.agent(agent.id).built)).toBe(0)
      expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`agent:${agent.id}`).lease)).toBe(0)
    } finally {
      await inboxes.close()
      await readOnly.end()
    }
  })
})

describe('a rebuild that finds a newer fence in Postgres than Redis drew (Redis lost its counter)', () => {
  test('answers the poll from Postgres, leaves Redis alone, lifts the counter; the next rebuild builds', async () => {
    const agent = agents.filter(a => a.pending)[1]!
    const actor = `agent:${agent.id}`
    const { redis, keys } = ctx.deps
    // A holder paused past its lease may hold this token: a rebuild under a lower one fences nothing out.
    const newer = 1_000_000_000
    await ctx.deps.sql`
      insert into actor_fences (actor, token, last_at) values (${actor}, ${newer}, now())
      on conflict (actor) do update set token = ${newer}
    `
    await redis.del(keys.actor(actor).fence)
    const inboxes = await createInboxReader(ctx.deps)
    try {
      await invalidateInbox(ctx.deps, agent.id)
      expect((await inboxes.read(agent.id)).conversations).toHaveLength(1)
      expect(await redis.exists(keys.agent(agent.id).built)).toBe(0)
      expect(Number(await redis.get(keys.actor(actor).fence))).toBeGreaterThanOrEqual(newer)
      expect((await inboxes.read(agent.id)).conversations).toHaveLength(1)
      expect(await redis.exists(keys.agent(agent.id).built)).toBe(1)
    } finally {
      await inboxes.close()
    }
  })
})
