import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { addMonths } from '../src/billing/periods.ts'
import {
  createAgent,
  createTestContext,
  expectError,
  halfAMillisecondAfter,
  idsBefore,
  idsPagedByBefore,
  signUp,
  type TestAgent,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let owner: TestUser

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
})
afterAll(() => ctx.close())

async function agentWithPlan(terms: Record<string, unknown> = {}): Promise<{ agent: TestAgent; planId: string }> {
  const agent = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'Basic', monthlyPriceCents: 1000, includedProxyCalls: 100, overagePerCallCents: 5, ...terms },
  })
  return { agent, planId: plan.body.data.id }
}

const participant = async (id: string) => (await ctx.call('GET', `/v1/participants/${id}`)).body.data

describe('billing periods', () => {
  test('are calendar months from the start with the day clamped, anchored to the start', () => {
    const jan31 = new Date('2027-01-31T10:00:00.000Z')
    expect(addMonths(jan31, 1).toISOString()).toBe('2027-02-28T10:00:00.000Z')
    expect(addMonths(jan31, 2).toISOString()).toBe('2027-03-31T10:00:00.000Z')
    expect(addMonths(new Date('2028-01-31T00:00:00.000Z'), 1).toISOString()).toBe('2028-02-29T00:00:00.000Z')
    expect(addMonths(new Date('2026-12-15T00:00:00.000Z'), 1).toISOString()).toBe('2027-01-15T00:00:00.000Z')
    expect(addMonths(new Date('2026-03-31T23:59:59.999Z'), 11).toISOString()).toBe('2027-02-28T23:59:59.999Z')
  })
})

describe('subscribing', () => {
  test('creates an active subscription with one calendar month period and counts the subscriber', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    ctx.clock.set(new Date('2027-01-31T12:00:00.000Z'))
    const res = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
    ctx.clock.set(new Date())
    expect(res.status).toBe(201)
    expect(res.body.data).toMatchObject({
      planId,
      participantId: agent.id,
      participantName: agent.name,
      planName: 'Basic',
      status: 'active',
      usage: { proxyCalls: 0, includedProxyCalls: 100 },
      cancelledAt: null,
    })
    // the clock runs on from the instant it was set to, so compare to the minute
    expect(res.body.data.currentPeriodStart.slice(0, 16)).toBe('2027-01-31T12:00')
    expect(res.body.data.currentPeriodEnd.slice(0, 16)).toBe('2027-02-28T12:00')
    expect(res.body.data.currentPeriodEnd).toBe(addMonths(new Date(res.body.data.currentPeriodStart), 1).toISOString())
    expect((await participant(agent.id)).activeSubscribers).toBe(1)
  })

  test('refuses one’s own agent (403), an unknown plan (404), and a second active one (409)', async () => {
    const { planId } = await agentWithPlan()
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: owner.token, body: { planId } }), 403, 'cannot_subscribe_own_agent')
    const user = await signUp(ctx)
    expectError(
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: '00000000-0000-4000-8000-000000000000' } }),
      404,
      'not_found',
    )
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).status).toBe(201)
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } }), 409, 'already_subscribed')
  })

  test('a second plan of the same agent is still one subscription per agent', async () => {
    const { agent, planId } = await agentWithPlan()
    const second = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: agent.id, name: 'Other', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const user = await signUp(ctx)
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).status).toBe(201)
    expectError(
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: second.body.data.id } }),
      409,
      'already_subscribed',
    )
  })

  test('50 concurrent subscribe calls by one user create exactly one subscription', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const results = await Promise.all(
      Array.from({ length: 50 }, () => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })),
    )
    expect(results.filter(r => r.status === 201).length).toBe(1)
    for (const r of results.filter(r => r.status !== 201)) expectError(r, 409, 'already_subscribed')
    const [row] = await ctx.deps.sql`select count(*)::int as n from subscriptions where participant_id = ${agent.id}`
    expect(row!.n).toBe(1)
    expect((await participant(agent.id)).activeSubscribers).toBe(1)
  })

  test('expectedTerms: terms changed since the plan was read are 409 price_changed, and nothing is created or charged', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const seen = { monthlyPriceCents: 1000, includedProxyCalls: 100, overagePerCallCents: 5 }
    const raised = await ctx.call('PATCH', `/v1/billing/plans/${planId}`, { token: owner.token, body: { monthlyPriceCents: 2500 } })
    expect(raised.status).toBe(200)
    const refused = expectError(
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId, expectedTerms: seen } }),
      409,
      'price_changed',
    )
    expect(refused.message).toContain('2500 cents a month')
    const [count] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from subscriptions where user_id = ${user.id}`
    expect(count!.n).toBe(0)
    expect((await participant(agent.id)).activeSubscribers).toBe(0)

    // The terms as they are now: subscribed, and the first period is billed at them.
    const now = { ...seen, monthlyPriceCents: 2500 }
    const taken = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId, expectedTerms: now } })
    expect(taken.status).toBe(201)
    const [period] = await ctx.deps.sql<{ price: number }[]>`
      select monthly_price_cents as price from subscription_periods where subscription_id = ${taken.body.data.id} and period_index = 0`
    expect(period!.price).toBe(2500)
    // Part of the terms, or an unknown field in them, is refused as bad input.
    const other = await signUp(ctx)
    const partial = { planId, expectedTerms: { monthlyPriceCents: 2500 } }
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: partial }), 400, 'validation_failed')
    const extra = { planId, expectedTerms: { ...now, currency: 'usd' } }
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: extra }), 400, 'validation_failed')
  })

  test('a price change reaches existing subscribers only from their next period', async () => {
    const { planId } = await agentWithPlan({ includedProxyCalls: 100, monthlyPriceCents: 1000 })
    const user = await signUp(ctx)
    const sub = (await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).body.data
    await ctx.call('PATCH', `/v1/billing/plans/${planId}`, { token: owner.token, body: { includedProxyCalls: 5, monthlyPriceCents: 9999 } })
    const list = await ctx.call('GET', '/v1/billing/subscriptions', { token: user.token })
    expect(list.body.data.find((s: { id: string }) => s.id === sub.id).usage.includedProxyCalls).toBe(100)
    const [terms] = await ctx.deps.sql`
      select monthly_price_cents as price from subscription_periods where subscription_id = ${sub.id} and period_index = 0
    `
    expect(terms!.price).toBe(1000)
  })
})

describe('Idempotency-Key on subscribe', () => {
  test('the same key and body replays the first response; nothing happens twice', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'sub-key-1' }
    const first = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
    const again = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
    expect(first.status).toBe(201)
    expect(again.status).toBe(201)
    expect(again.body).toEqual(first.body)
    expect((await participant(agent.id)).activeSubscribers).toBe(1)
  })

  test('the same key with another body is 409 idempotency_key_reused; keys are per caller', async () => {
    const a = await agentWithPlan()
    const b = await agentWithPlan()
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'shared-key' }
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: a.planId }, headers })).status).toBe(201)
    expectError(
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: b.planId }, headers }),
      409,
      'idempotency_key_reused',
    )
    const someoneElse = await signUp(ctx)
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: someoneElse.token, body: { planId: b.planId }, headers })).status).toBe(201)
  })

  test('concurrent repeats with one key create one subscription: each answer is the first’s or 409 in progress', async () => {
    // CONTRACT.md §9: a repeat while the first still runs is 409 idempotency_key_in_progress with
    // Retry-After, not a wait; once the first is done, a repeat replays it.
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'race' }
    const results = await Promise.all(
      Array.from({ length: 20 }, () => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })),
    )
    const created = results.filter(r => r.status === 201)
    expect(created.length).toBeGreaterThan(0)
    expect(new Set(created.map(r => r.body.data.id)).size).toBe(1)
    for (const r of results.filter(r => r.status !== 201)) {
      expectError(r, 409, 'idempotency_key_in_progress')
      expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    }
    const replay = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
    expect([replay.status, replay.body]).toEqual([201, created[0]!.body])
    expect((await participant(agent.id)).activeSubscribers).toBe(1)
  })

  test('a repeat while the first is still running is 409 in progress with Retry-After and changes nothing', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'held' }
    const subscribe = () => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
    const subscriptions = async () =>
      (await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from subscriptions where participant_id = ${agent.id}`)[0]!.n
    // The agent's row held by the test: the first subscribe waits on it inside its transaction.
    let release!: () => void
    const released = new Promise<void>(resolve => (release = resolve))
    let locked!: () => void
    const holding = new Promise<void>(resolve => (locked = resolve))
    const held = ctx.deps.sql.begin(async tx => {
      await tx`select 1 from participants where id = ${agent.id} for update`
      locked()
      await released
    })
    await holding
    const first = subscribe()
    const waiting = async () =>
      (
        await ctx.deps.sql<{ n: number }[]>`
        select count(*)::int as n from pg_stat_activity
        where datname = current_database() and wait_event_type = 'Lock' and query like '%from plans p join participants%'
      `
      )[0]!.n === 1
    await until(waiting, 5000)
    const repeat = await subscribe()
    expectError(repeat, 409, 'idempotency_key_in_progress')
    expect(repeat.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/)
    expect(await subscriptions()).toBe(0)
    release()
    await held
    const answered = await first
    expect(answered.status).toBe(201)
    const replay = await subscribe()
    expect([replay.status, replay.body]).toEqual([201, answered.body])
    expect(await subscriptions()).toBe(1)
  })

  test('a failed call stores nothing, and a key past 24 h runs again', async () => {
    const { planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const headers = { 'idempotency-key': 'retry-me' }
    await ctx.call('DELETE', `/v1/billing/plans/${planId}`, { token: owner.token })
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers }), 409, 'plan_inactive')
    const [row] = await ctx.deps.sql`select count(*)::int as n from idempotency_keys where key = 'retry-me'`
    expect(row!.n).toBe(0)
    expectError(
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers: { 'idempotency-key': 'x'.repeat(256) } }),
      400,
      'validation_failed',
    )
  })
})

describe('listing and cancelling', () => {
  test('lists the caller’s subscriptions newest first, active and cancelled, and nobody else’s', async () => {
    const one = await agentWithPlan()
    const two = await agentWithPlan()
    const user = await signUp(ctx)
    const first = (await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: one.planId } })).body.data
    ctx.clock.advance(1000)
    const second = (await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: two.planId } })).body.data
    await ctx.call('DELETE', `/v1/billing/subscriptions/${first.id}`, { token: user.token })
    const list = await ctx.call('GET', '/v1/billing/subscriptions', { token: user.token })
    expect(list.status).toBe(200)
    expect(list.body.data.map((s: { id: string; status: string }) => [s.id, s.status])).toEqual([
      [second.id, 'active'],
      [first.id, 'cancelled'],
    ])
    const limited = await ctx.call('GET', '/v1/billing/subscriptions?limit=1', { token: user.token })
    expect(limited.body.data.length).toBe(1)
    const older = await ctx.call('GET', `/v1/billing/subscriptions?before=${encodeURIComponent(second.createdAt)}`, { token: user.token })
    expect(older.body.data.map((s: { id: string }) => s.id)).toEqual([first.id])
    expectError(await ctx.call('GET', '/v1/billing/subscriptions?limit=0', { token: user.token }), 400, 'validation_failed')
    expectError(await ctx.call('GET', '/v1/billing/subscriptions?limit=101', { token: user.token }), 400, 'validation_failed')
    expectError(await ctx.call('GET', '/v1/billing/subscriptions?before=yesterday', { token: user.token }), 400, 'validation_failed')
    const stranger = await signUp(ctx)
    expect((await ctx.call('GET', '/v1/billing/subscriptions', { token: stranger.token })).body.data).toEqual([])
  })

  test('subscriptions made at once are dated a millisecond apart, so paging them by `before` skips none', async () => {
    const plans = await Promise.all(Array.from({ length: 5 }, () => agentWithPlan()))
    const user = await signUp(ctx)
    ctx.clock.freeze(new Date())
    let made: string[]
    try {
      const results = await Promise.all(
        plans.map(({ planId }) => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })),
      )
      made = results.map(r => r.body.data.id)
    } finally {
      ctx.clock.resume()
    }
    const seen = await idsPagedByBefore(ctx, '/v1/billing/subscriptions', { token: user.token })
    expect(seen.sort()).toEqual(made.sort())
  })

  test('a subscription is older than a `before` finer than a millisecond in its millisecond: listed, as it is not at its own time', async () => {
    const { planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const made = (await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).body.data
    const path = '/v1/billing/subscriptions'
    expect(await idsBefore(ctx, path, { token: user.token }, halfAMillisecondAfter(made.createdAt))).toEqual([made.id])
    expect(await idsBefore(ctx, path, { token: user.token }, made.createdAt)).toEqual([])
  })

  test('cancel: 200 then 409 already_cancelled; another user gets 404; the count drops; resubscribing works', async () => {
    const { agent, planId } = await agentWithPlan()
    const user = await signUp(ctx)
    const sub = (await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).body.data
    const stranger = await signUp(ctx)
    expectError(await ctx.call('DELETE', `/v1/billing/subscriptions/${sub.id}`, { token: stranger.token }), 404, 'not_found')
    const cancelled = await ctx.call('DELETE', `/v1/billing/subscriptions/${sub.id}`, { token: user.token })
    expect(cancelled.status).toBe(200)
    expect(cancelled.body.data.status).toBe('cancelled')
    expect(cancelled.body.data.cancelledAt).not.toBeNull()
    expect((await participant(agent.id)).activeSubscribers).toBe(0)
    expectError(await ctx.call('DELETE', `/v1/billing/subscriptions/${sub.id}`, { token: user.token }), 409, 'already_cancelled')
    expectError(await ctx.call('DELETE', '/v1/billing/subscriptions/00000000-0000-4000-8000-000000000000', { token: user.token }), 404, 'not_found')
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).status).toBe(201)
    expect((await participant(agent.id)).activeSubscribers).toBe(1)
  })
})

describe('deactivating an agent while its subscribers come and go', () => {
  /** The agent's state as the database has it: no active subscription may outlive the agent. */
  const state = async (agentId: string) => {
    const [row] = await ctx.deps.sql<{ active: boolean; counted: number; live: number }[]>`
      select p.active, p.active_subscribers as counted,
        (select count(*)::int from subscriptions s where s.participant_id = p.id and s.status = 'active') as live
      from participants p where p.id = ${agentId}
    `
    return row!
  }

  test('cancellations racing the deactivation all end in 200 or 409, and the agent is left with none', async () => {
    for (let round = 0; round < 3; round++) {
      const { agent, planId } = await agentWithPlan()
      const users = await Promise.all(Array.from({ length: 20 }, () => signUp(ctx)))
      const ids: string[] = []
      for (const user of users) ids.push((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).body.data.id)
      const [deactivated, ...cancels] = await Promise.all([
        ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: owner.token }),
        ...users.map((user, i) => ctx.call('DELETE', `/v1/billing/subscriptions/${ids[i]}`, { token: user.token })),
      ])
      expect(deactivated.status).toBe(200)
      for (const cancel of cancels) {
        if (cancel.status !== 200) expectError(cancel, 409, 'already_cancelled')
      }
      expect(await state(agent.id)).toEqual({ active: false, counted: 0, live: 0 })
    }
  })

  test('subscriptions racing the deactivation are refused or ended with it: none stays active', async () => {
    for (let round = 0; round < 3; round++) {
      const { agent, planId } = await agentWithPlan()
      const users = await Promise.all(Array.from({ length: 20 }, () => signUp(ctx)))
      const subscribe = (user: TestUser) => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
      const results = await Promise.all([
        ...users.slice(0, 10).map(subscribe),
        ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: owner.token }),
        ...users.slice(10).map(subscribe),
      ])
      for (const result of results) {
        if (result.status !== 200 && result.status !== 201) expectError(result, 404, 'not_found')
      }
      expect(await state(agent.id)).toEqual({ active: false, counted: 0, live: 0 })
    }
  })
})
