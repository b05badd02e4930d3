/**
 * A table an operator locks (`alter table`, `vacuum full`, `create index` without `concurrently`, an
 * open `lock table`) must not take the whole API down: the statements of requests and workers give
 * up a lock wait after DATABASE_LOCK_TIMEOUT_MS (503, nothing changed), so the pool's connections
 * are not all held waiting on that table and routes on other tables are answered meanwhile.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createAgent, createTestContext, expectError, signUp, subscribedPair, type TestContext, type TestUser } from './helpers/context.ts'
import { startWorkers } from '../workers/index.ts'
import { isTransientFailure } from '../src/db.ts'
import { forInvoiceRun, forWorkers } from '../src/deps.ts'
import { createLog } from '../src/log.ts'

// A statement timeout far past what the tests wait: only the lock timeout can end a lock wait.
const env = { DATABASE_POOL_MAX: '3', DATABASE_STATEMENT_TIMEOUT_MS: '120000', DATABASE_LOCK_TIMEOUT_MS: '1000' }

let ctx: TestContext
let alice: TestUser
let operator: postgres.Sql
const records: { msg: string; route?: string; code?: string }[] = []

beforeAll(async () => {
  ctx = await createTestContext({ env, log: createLog('warn', line => records.push(JSON.parse(line))) })
  alice = await signUp(ctx, 'alice')
  operator = postgres(ctx.database.url, { max: 2, onnotice: () => {} })
})
afterAll(async () => {
  await operator.end()
  await ctx.close()
})

interface Held {
  /** Ends the operator's transaction (once; later calls do nothing). */
  release(): void
  /** Settles once the transaction has ended. */
  ended: Promise<void>
}

/** An operator's session (`session`) holding `statement`'s lock in an open transaction until released, or for `atMostMs` at most. */
async function hold(statement: string, atMostMs = 20_000, session = operator): Promise<Held> {
  let release!: () => void
  const released = new Promise<void>(resolve => (release = resolve))
  const fallback = setTimeout(() => release(), atMostMs)
  let locked!: () => void
  const holding = new Promise<void>(resolve => (locked = resolve))
  const ended = session
    .begin(async tx => {
      await tx.unsafe(statement)
      locked()
      await released
    })
    .then(() => clearTimeout(fallback))
  await holding
  return { release, ended }
}

/** Sessions of this test's database waiting on a lock now. */
async function lockWaiters(): Promise<number> {
  const [row] = await operator<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'
  `
  return row!.n
}

describe('a lock timeout', () => {
  test('with every pool connection waiting on a locked table, a route on other tables is answered before the lock goes', async () => {
    await createAgent(ctx, alice)
    const held = await hold('lock table connections in access exclusive mode')
    const order: string[] = []
    void held.ended.then(() => order.push('released'))
    // More requests on the locked table than the pool has connections: each holds one while it waits.
    const blocked = Array.from({ length: 6 }, () => ctx.call('GET', '/v1/connections', { token: alice.token }))
    while ((await lockWaiters()) < Number(env.DATABASE_POOL_MAX)) await Bun.sleep(10)

    const other = await ctx.call('GET', '/v1/participants', { token: alice.token })
    order.push('answered')
    held.release()
    await held.ended
    expect(other.status).toBe(200)
    expect(order).toEqual(['answered', 'released'])
    // Those that waited gave up (the last may have run after the lock went).
    const gaveUp = (await Promise.all(blocked)).filter(res => res.status !== 200)
    expect(gaveUp.length).toBeGreaterThanOrEqual(Number(env.DATABASE_POOL_MAX))
    for (const res of gaveUp) {
      expectError(res, 503, 'unavailable')
      expect(res.headers.get('retry-after')).toBe('1')
    }
    expect(records).toContainEqual(
      expect.objectContaining({ msg: 'database statement given up (lock or deadlock)', route: '/v1/connections', code: '55P03' }),
    )
    expect((await ctx.call('GET', '/v1/connections', { token: alice.token })).status).toBe(200)
  }, 40_000)

  test('a write waiting on a locked table is 503 with Retry-After, changes nothing, and works once the lock goes', async () => {
    const agent = await createAgent(ctx, alice)
    const held = await hold('lock table participants in access exclusive mode')
    const res = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Waited' } })
    held.release()
    await held.ended
    expectError(res, 503, 'unavailable')
    expect(res.headers.get('retry-after')).toBe('1')
    const [row] = await operator`select display_name from participants where id = ${agent.id}`
    expect(row!.display_name).not.toBe('Waited')

    const again = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Waited' } })
    expect(again.status).toBe(200)
    expect(again.body.data.displayName).toBe('Waited')
  }, 40_000)

  test('requests’ and workers’ connections have it; the invoice run’s has none', async () => {
    expect((await ctx.deps.sql`show lock_timeout`)[0]!.lock_timeout).toBe('1s')
    expect((await forWorkers(ctx.deps).sql`show lock_timeout`)[0]!.lock_timeout).toBe('1s')
    expect((await forInvoiceRun(ctx.deps).sql`show lock_timeout`)[0]!.lock_timeout).toBe('0')
  })

  test('a lock wait given up is transient', async () => {
    const held = await hold('lock table users in access exclusive mode')
    const error = await ctx.deps.sql`select count(*) from users`.catch((e: unknown) => e)
    held.release()
    await held.ended
    expect((error as { code: string }).code).toBe('55P03')
    expect(isTransientFailure(error)).toBe(true)
  })

  test('an actor’s turn that meets a locked table is tried again, not dead-lettered, and applied once the lock goes', async () => {
    const workers = await startWorkers(ctx.deps)
    try {
      const { agent, user } = await subscribedPair(ctx, alice)
      const send = (text: string, key: string) =>
        ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, headers: { 'idempotency-key': key }, body: { text } })
      expect((await send('one', 'k1')).status).toBe(201)
      // Held for longer than five turns (the dead-letter count) of a lock timeout each, short of the ask's 10 s.
      const held = await hold('lock table messages in access exclusive mode', 7000)
      const second = send('two', 'k2')
      await held.ended
      expect((await second).status).toBe(201)
      expect(records).toContainEqual(
        expect.objectContaining({ msg: 'actor turn failed; its commands wait in their mailboxes and are tried again', code: '55P03' }),
      )
      const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
      expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['two', 'one'])
      expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`agent:${agent.id}`).dead)).toBe(0)
    } finally {
      await workers.close()
    }
  }, 40_000)

  test('a purchase waits out an invoice batch holding the invoice counter longer than the lock timeout', async () => {
    const agent = await createAgent(ctx, alice)
    const listing = { participantId: agent.id, name: 'Rules', priceCents: 499, fileType: '.cursorrules', content: 'SECRET' }
    const config = await ctx.call('POST', '/v1/billing/configs', { token: alice.token, body: listing })
    expect(config.status).toBe(201)
    const buyer = await signUp(ctx)
    // As the run's batch holds it until it commits (2.6 s measured), here two and a half lock timeouts.
    const held = await hold('select 1 from invoice_counter for no key update', 2500)
    const bought = await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: buyer.token })
    await held.ended
    expect(bought.status).toBe(201)
    expect(bought.body.data.invoiceId).toMatch(/^[0-9a-f-]{36}$/)
    // The wait is the counter's alone: the purchase's statements after it give up as any request's.
    const other = await ctx.call('POST', '/v1/billing/configs', { token: alice.token, body: { ...listing, name: 'Other' } })
    const lines = await hold('lock table invoice_lines in access exclusive mode')
    const refused = await ctx.call('POST', `/v1/billing/configs/${other.body.data.id}/purchase`, { token: buyer.token })
    lines.release()
    await lines.ended
    expectError(refused, 503, 'unavailable')
    expect((await ctx.call('POST', `/v1/billing/configs/${other.body.data.id}/purchase`, { token: buyer.token })).status).toBe(201)
  }, 40_000)

  test('an agent’s reply waiting on its locked conversation is 503 with Retry-After, and stored when sent again', async () => {
    // A context of its own: the log says a lock wait given up once per 10 s, and another test's may have said it.
    const replies: typeof records = []
    const ctx = await createTestContext({ env, log: createLog('warn', line => replies.push(JSON.parse(line))) })
    const session = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
    const workers = await startWorkers(ctx.deps)
    try {
      const { agent, user } = await subscribedPair(ctx, await signUp(ctx))
      expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello' } })).status).toBe(201)
      // The row itself: the writer skips it in its batch and then waits for it alone (wait mode).
      const held = await hold(`select 1 from conversations where participant_id = '${agent.id}' for update`, 20_000, session)
      const reply = () =>
        ctx.call('POST', '/v1/agent/conversation-reply', {
          apiKey: agent.apiKey,
          headers: { 'idempotency-key': 'r1' },
          body: { userId: user.id, text: 'hi' },
        })
      const res = await reply()
      held.release()
      await held.ended
      expectError(res, 503, 'unavailable')
      expect(res.headers.get('retry-after')).toBe('1')
      expect(replies).toContainEqual(
        expect.objectContaining({ msg: 'database statement given up (lock or deadlock)', route: '/v1/agent/conversation-reply', code: '55P03' }),
      )
      expect((await reply()).status).toBe(201)
      const history = await ctx.call('GET', `/v1/conversations/${agent.id}/messages`, { token: user.token })
      expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['hi', 'hello'])
    } finally {
      await workers.close()
      await session.end()
      await ctx.close()
    }
  }, 40_000)
})
