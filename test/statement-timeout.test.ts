/**
 * A request's statement that waits past DATABASE_STATEMENT_TIMEOUT_MS is cancelled by Postgres: 503,
 * nothing changed. The workers' statements have the same limit, and an actor's command whose turn it
 * cancels is tried again until it is applied; the invoice run's have none.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createAgent, createTestContext, expectError, signUp, subscribedPair, type TestContext, type TestUser } from './helpers/context.ts'
import { startWorkers } from '../workers/index.ts'
import { isTransientFailure } from '../src/db.ts'
import { forInvoiceRun, forWorkers } from '../src/deps.ts'
import { createLog } from '../src/log.ts'

let ctx: TestContext
let alice: TestUser
let other: postgres.Sql

beforeAll(async () => {
  ctx = await createTestContext({ env: { DATABASE_STATEMENT_TIMEOUT_MS: '300' } })
  alice = await signUp(ctx, 'alice')
  other = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
})
afterAll(async () => {
  await other.end()
  await ctx.close()
})

describe('a statement timeout', () => {
  test('a request waiting on a row another session holds is 503 with Retry-After, changes nothing, and works once it is let go', async () => {
    const agent = await createAgent(ctx, alice)
    let letGo!: () => void
    const released = new Promise<void>(resolve => (letGo = resolve))
    let locked!: () => void
    const holding = new Promise<void>(resolve => (locked = resolve))
    const session = other.begin(async tx => {
      await tx`select id from participants where id = ${agent.id} for update`
      locked()
      await released
    })
    await holding

    const started = Date.now()
    const res = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Waited' } })
    expectError(res, 503, 'unavailable')
    expect(res.headers.get('retry-after')).toBe('1')
    // Cancelled by the timeout, not after some other wait.
    expect(Date.now() - started).toBeLessThan(5000)

    letGo()
    await session
    const [row] = await other`select display_name from participants where id = ${agent.id}`
    expect(row!.display_name).not.toBe('Waited')

    const again = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Waited' } })
    expect(again.status).toBe(200)
    expect(again.body.data.displayName).toBe('Waited')
  })

  test('requests’ and workers’ connections have the timeout; the invoice run’s has none', async () => {
    expect((await ctx.deps.sql`show statement_timeout`)[0]!.statement_timeout).toBe('300ms')
    expect((await forWorkers(ctx.deps).sql`show statement_timeout`)[0]!.statement_timeout).toBe('300ms')
    expect((await forInvoiceRun(ctx.deps).sql`show statement_timeout`)[0]!.statement_timeout).toBe('0')
  })

  test('a user’s message whose conversation another session holds for 8 s, 26 times the timeout, is applied once it is let go', async () => {
    const workers = await startWorkers(ctx.deps)
    try {
      const { agent, user } = await subscribedPair(ctx, alice)
      const send = (text: string, key: string) =>
        ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, headers: { 'idempotency-key': key }, body: { text } })
      expect((await send('one', 'k1')).status).toBe(201)
      let letGo!: () => void
      const released = new Promise<void>(resolve => (letGo = resolve))
      let locked!: () => void
      const holding = new Promise<void>(resolve => (locked = resolve))
      const session = other.begin(async tx => {
        await tx`select 1 from conversations where participant_id = ${agent.id} for update`
        locked()
        await released
      })
      await holding
      const second = send('two', 'k2')
      // Long enough for a runtime that counted each cancelled turn against the command to have
      // moved it to the dead-letter stream (5 attempts), short of the ask's 10 s. Meanwhile no
      // statement of the workers waits on the row for longer than the timeout: each is cancelled.
      let longest = 0
      for (const until = Date.now() + 8000; Date.now() < until; await Bun.sleep(100)) {
        const [row] = await ctx.deps.sql<{ ms: number }[]>`
          select coalesce(max(extract(epoch from clock_timestamp() - query_start) * 1000), 0)::float8 as ms
          from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'
        `
        longest = Math.max(longest, row!.ms)
      }
      expect(longest).toBeGreaterThan(0)
      expect(longest).toBeLessThan(2000)
      letGo()
      await session
      expect((await second).status).toBe(201)
      const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
      expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['two', 'one'])
      expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`agent:${agent.id}`).dead)).toBe(0)
    } finally {
      await workers.close()
    }
  }, 20_000)

  test('an agent’s reply waiting on its conversation another session holds is 503 with Retry-After, and logged as a timeout', async () => {
    // A context of its own: the log says a timeout once per 10 s, and another test's may have said it.
    const records: { msg: string; route?: string; code?: string }[] = []
    const log = createLog('warn', line => records.push(JSON.parse(line)))
    const ctx = await createTestContext({ env: { DATABASE_STATEMENT_TIMEOUT_MS: '300' }, log })
    const workers = await startWorkers(ctx.deps)
    try {
      const { agent, user } = await subscribedPair(ctx, await signUp(ctx))
      expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello' } })).status).toBe(201)
      let letGo!: () => void
      const released = new Promise<void>(resolve => (letGo = resolve))
      let locked!: () => void
      const holding = new Promise<void>(resolve => (locked = resolve))
      const session = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
      const held = session.begin(async tx => {
        await tx`select 1 from conversations where participant_id = ${agent.id} for update`
        locked()
        await released
      })
      await holding
      const reply = () => ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: 'hi' } })
      const res = await reply()
      letGo()
      await held
      await session.end()
      expectError(res, 503, 'unavailable')
      expect(res.headers.get('retry-after')).toBe('1')
      // The cause is in the log, as for any request's own statement: a lock wait that said nothing
      // left an operator with 503s and 30-second replies and no reason.
      expect(records).toContainEqual(
        expect.objectContaining({ msg: 'database statement cancelled (statement timeout)', route: '/v1/agent/conversation-reply', code: '57014' }),
      )
      expect((await reply()).status).toBe(201)
    } finally {
      await workers.close()
      await ctx.close()
    }
  }, 20_000)

  test('Postgres’s own give-ups (a timeout, a deadlock) are transient; a query’s errors are not', async () => {
    const caught = (query: Promise<unknown>) =>
      query.then(
        () => null,
        (error: unknown) => error,
      )
    const timedOut = await caught(other.begin(tx => tx`set local statement_timeout = 10`.then(() => tx`select pg_sleep(1)`)))
    expect((timedOut as { code: string }).code).toBe('57014')
    expect(isTransientFailure(timedOut)).toBe(true)

    // Two sessions taking two rows in opposite orders: Postgres picks one to fail (after deadlock_timeout, 1 s).
    await other`create table if not exists deadlock_probe (id int primary key)`
    await other`insert into deadlock_probe values (1), (2) on conflict do nothing`
    const second = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
    try {
      // Each takes its first row, and goes for its second only once both hold their first.
      let held = 0
      let bothHold!: () => void
      const barrier = new Promise<void>(resolve => (bothHold = resolve))
      const crossing = (sql: postgres.Sql, [a, b]: number[]) =>
        caught(
          sql.begin(async tx => {
            await tx`update deadlock_probe set id = id where id = ${a!}`
            if (++held === 2) bothHold()
            await barrier
            await tx`update deadlock_probe set id = id where id = ${b!}`
          }),
        )
      const outcomes = await Promise.all([crossing(other, [1, 2]), crossing(second, [2, 1])])
      const deadlocked = outcomes.filter(e => e !== null)
      expect(deadlocked.map(e => (e as { code: string }).code)).toEqual(['40P01'])
      expect(isTransientFailure(deadlocked[0])).toBe(true)
    } finally {
      await second.end()
    }

    expect(isTransientFailure(await caught(other`select 1/0`))).toBe(false)
    expect(isTransientFailure(await caught(other`select * from no_such_table`))).toBe(false)
  })
})
