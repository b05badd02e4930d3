import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { until } from './helpers/until.ts'
import { runInvoices } from '../src/invoices/run.ts'
import { deactivatePlan, findPlan, updatePlan } from '../src/billing/plans/store.ts'
import { announcePlanChange, planChangeEvents } from '../src/billing/plans/price-change.ts'
import { insertSubscription } from '../src/billing/subscriptions/store.ts'
import { holdDeactivation, lockWaited as waitedForLock } from './helpers/deactivation.ts'
import { holdOpen } from './helpers/held-transaction.ts'

let ctx: TestContext
let owner: TestUser
let other: TestUser
let agent: TestAgent

const planBody = (participantId: string, extra: Record<string, unknown> = {}) => ({
  participantId,
  name: 'Pro',
  description: 'Everything',
  monthlyPriceCents: 2500,
  includedProxyCalls: 1000,
  overagePerCallCents: 2,
  ...extra,
})

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  other = await signUp(ctx)
  agent = await createAgent(ctx, owner)
})
afterAll(() => ctx.close())

describe('plans', () => {
  test('the owner creates a plan: 201 with every field', async () => {
    const res = await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(agent.id) })
    expect(res.status).toBe(201)
    expect(res.body.data).toMatchObject({
      participantId: agent.id,
      name: 'Pro',
      description: 'Everything',
      monthlyPriceCents: 2500,
      includedProxyCalls: 1000,
      overagePerCallCents: 2,
      active: true,
    })
    expect(res.body.data.id).toMatch(/^[0-9a-f-]{36}$/)
    expect(res.body.data.updatedAt).toBe(res.body.data.createdAt)
  })

  test.each([
    ['monthlyPriceCents', -1],
    ['monthlyPriceCents', 10_000_001],
    ['monthlyPriceCents', 1.5],
    ['includedProxyCalls', 10_000_001],
    ['overagePerCallCents', 100_001],
    ['name', ''],
    ['name', 'x'.repeat(101)],
    ['description', 'x'.repeat(1001)],
  ])('refuses %s out of range (case %#) with 400 and writes nothing', async (field, value) => {
    const body = expectError(
      await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(agent.id, { [field]: value }) }),
      400,
      'validation_failed',
    )
    expect(body.details.some((d: { path: string }) => d.path === `/${field}`)).toBe(true)
    const [row] = await ctx.deps.sql`select count(*)::int as n from plans where participant_id = ${agent.id} and name <> 'Pro'`
    expect(row!.n).toBe(0)
  })

  test('accepts the range limits', async () => {
    const res = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: planBody(agent.id, { name: 'Max', monthlyPriceCents: 10_000_000, includedProxyCalls: 10_000_000, overagePerCallCents: 100_000 }),
    })
    expect(res.status).toBe(201)
    const free = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: planBody(agent.id, { name: 'Free', monthlyPriceCents: 0, includedProxyCalls: 0, overagePerCallCents: 0 }),
    })
    expect(free.status).toBe(201)
  })

  test('a non-owner cannot create, patch or delete plans (403), and an unknown agent is 404', async () => {
    expectError(await ctx.call('POST', '/v1/billing/plans', { token: other.token, body: planBody(agent.id) }), 403, 'forbidden')
    const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(agent.id) })).body.data
    expectError(await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: other.token, body: { name: 'Hijack' } }), 403, 'forbidden')
    expectError(await ctx.call('DELETE', `/v1/billing/plans/${plan.id}`, { token: other.token }), 403, 'forbidden')
    expectError(
      await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody('00000000-0000-4000-8000-000000000000') }),
      404,
      'not_found',
    )
    const after = await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: other.token })
    expect(after.body.data.find((p: { id: string }) => p.id === plan.id).name).toBe('Pro')
  })

  test('patch changes any field but participantId', async () => {
    const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(agent.id) })).body.data
    ctx.clock.advance(1000)
    const res = await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, {
      token: owner.token,
      body: { name: 'Pro 2', monthlyPriceCents: 3000, description: null },
    })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ name: 'Pro 2', monthlyPriceCents: 3000, description: null, includedProxyCalls: 1000 })
    expect(res.body.data.updatedAt > plan.updatedAt).toBe(true)
    expectError(
      await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { participantId: agent.id } }),
      400,
      'validation_failed',
    )
    expectError(
      await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { overagePerCallCents: -5 } }),
      400,
      'validation_failed',
    )
  })

  test('delete deactivates: hidden from others, shown to the owner, no new subscriptions', async () => {
    const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(agent.id, { name: 'Old' }) })).body.data
    const res = await ctx.call('DELETE', `/v1/billing/plans/${plan.id}`, { token: owner.token })
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ id: plan.id, active: false })
    const seenByOther = await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: other.token })
    expect(seenByOther.body.data.map((p: { id: string }) => p.id)).not.toContain(plan.id)
    const seenByOwner = await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: owner.token })
    expect(seenByOwner.body.data.find((p: { id: string }) => p.id === plan.id).active).toBe(false)
    expectError(await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId: plan.id } }), 409, 'plan_inactive')
  })

  test('listing needs a credential and a known agent', async () => {
    expectError(await ctx.call('GET', `/v1/billing/plans/${agent.id}`), 401, 'unauthorized')
    expect((await ctx.call('GET', `/v1/billing/plans/${agent.id}`, { apiKey: agent.apiKey })).status).toBe(200)
    expectError(await ctx.call('GET', '/v1/billing/plans/00000000-0000-4000-8000-000000000000', { token: other.token }), 404, 'not_found')
    expectError(await ctx.call('GET', '/v1/billing/plans/not-a-uuid', { token: other.token }), 400, 'validation_failed')
  })
})

describe('a change of a plan’s terms for its existing subscribers', () => {
  const at = (iso: string) => ctx.clock.freeze(new Date(iso))
  const subscribe = async (planId: string) => {
    const user = await signUp(ctx)
    const res = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
    expect(res.status).toBe(201)
    return { user, subscriptionId: res.body.data.id as string }
  }
  /** A plan with `terms` of a new agent of the owner's, made at `when` (the clock stays there), and a first subscriber. */
  const subscribedPlan = async (when: string, terms: Record<string, number>) => {
    const mine = await createAgent(ctx, owner)
    at(when)
    const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: planBody(mine.id, terms) })).body.data
    return { plan, a: await subscribe(plan.id) }
  }
  /** Each period of the subscription: its start, monthly price, included calls and overage price. */
  const periodTerms = async (subscriptionId: string) =>
    (
      await ctx.deps.sql<{ start: Date; monthly: number; included: number; overage: number }[]>`
        select period_start as "start", monthly_price_cents as monthly, included_proxy_calls as included, overage_per_call_cents as overage
        from subscription_periods where subscription_id = ${subscriptionId} order by period_index
      `
    ).map(p => [p.start.toISOString(), p.monthly, p.included, p.overage])
  /** The `plan.changed` events on the user's stream, once `count` are there. */
  const planChanges = async (userId: string, count: number) => {
    let found: any[] = []
    await until(async () => {
      const entries = await ctx.deps.redis.xrange(ctx.deps.keys.events.user(userId), '-', '+')
      found = entries.map(([, fields]) => ({ type: fields[1], data: JSON.parse(fields[3]!) })).filter(event => event.type === 'plan.changed')
      return found.length >= count
    }, 5000)
    return found.map(event => event.data)
  }
  const invoiced = async (userId: string) =>
    (
      await ctx.deps.sql<{ periodStart: Date; totalCents: number }[]>`
      select period_start as "periodStart", total_cents as "totalCents" from invoices where user_id = ${userId} order by period_start
    `
    ).map(row => [row.periodStart.toISOString(), row.totalCents])

  test('are found through their agent’s index, not by reading every subscription of the marketplace', async () => {
    // A marketplace's statistics, analysed: 3,000 subscriptions of 100 agents. Subscriptions have no
    // index by plan; without the agent in the statement, any plan's change read every subscription.
    const tag = randomUUID().slice(0, 8)
    await ctx.deps.sql`
      insert into users (id, provider_id) select md5(${tag} || 'u' || i)::uuid, ${tag} || '-' || i from generate_series(1, 3000) i
    `
    await ctx.deps.sql`
      insert into participants (id, owner_id, name, display_name)
      select md5(${tag} || 'a' || j)::uuid, ${owner.id}, 'p' || ${tag} || '-' || j, 'Agent' from generate_series(1, 100) j
    `
    await ctx.deps.sql`
      insert into plans (id, participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
      select md5(${tag} || 'p' || j)::uuid, md5(${tag} || 'a' || j)::uuid, 'Plan', 100, 0, 0, now(), now() from generate_series(1, 100) j
    `
    await ctx.deps.sql`
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select md5(${tag} || 'u' || i)::uuid, md5(${tag} || 'a' || (1 + i % 100))::uuid, md5(${tag} || 'p' || (1 + i % 100))::uuid,
        'active', now(), now()
      from generate_series(1, 3000) i
    `
    await ctx.deps.sql`analyze subscriptions`
    const [plan] = await ctx.deps.sql<{ id: string; participantId: string }[]>`
      select id, participant_id as "participantId" from plans where id = md5(${tag} || 'p1')::uuid
    `
    const terms = { monthlyPriceCents: 100, includedProxyCalls: 0, overagePerCallCents: 0 }
    const change = { previous: terms, terms: { ...terms, monthlyPriceCents: 200 } }
    const rows = await ctx.deps.sql<{ 'QUERY PLAN': string }[]>`
      explain ${planChangeEvents(ctx.deps.sql, { ...plan!, name: 'Plan' }, change, new Date())}
    `
    const explained = rows.map(row => row['QUERY PLAN']).join('\n')
    expect(explained).toMatch(/(using|on) subscriptions_by_(participant|agent)/)
    expect(explained).not.toMatch(/Seq Scan on subscriptions|subscriptions_pkey/)
  })

  test('a rise is billed from the period after the one that follows its notice (plan.changed), a drop from the next', async () => {
    const { plan, a } = await subscribedPlan('2025-01-10T12:00:00.000Z', { monthlyPriceCents: 1000, includedProxyCalls: 0, overagePerCallCents: 0 })
    at('2025-01-30T12:00:00.000Z')
    const b = await subscribe(plan.id)
    const gone = await subscribe(plan.id)
    await ctx.call('DELETE', `/v1/billing/subscriptions/${gone.subscriptionId}`, { token: gone.user.token })
    try {
      // In A's first period (to Feb 10) and B's (to Feb 28).
      at('2025-02-05T00:00:00.000Z')
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { monthlyPriceCents: 5000 } })).status).toBe(200)
      // In A's third period (Mar 10 to Apr 10) and B's second (Feb 28 to Mar 30).
      at('2025-03-15T00:00:00.000Z')
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { monthlyPriceCents: 2000 } })).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }

    const terms = (monthlyPriceCents: number) => ({ monthlyPriceCents, includedProxyCalls: 0, overagePerCallCents: 0 })
    const told = (subscriptionId: string, changes: [number, number, string, string][]) =>
      changes.map(([from, to, createdAt, effectiveFrom]) => ({
        type: 'plan.changed',
        createdAt,
        planId: plan.id,
        planName: 'Pro',
        participantId: plan.participantId,
        subscriptionId,
        previous: terms(from),
        terms: terms(to),
        effectiveFrom,
      }))
    expect(await planChanges(a.user.id, 2)).toEqual(
      told(a.subscriptionId, [
        [1000, 5000, '2025-02-05T00:00:00.000Z', '2025-03-10T12:00:00.000Z'],
        [5000, 2000, '2025-03-15T00:00:00.000Z', '2025-04-10T12:00:00.000Z'],
      ]),
    )
    expect(await planChanges(b.user.id, 2)).toEqual(
      told(b.subscriptionId, [
        [1000, 5000, '2025-02-05T00:00:00.000Z', '2025-03-30T12:00:00.000Z'],
        [5000, 2000, '2025-03-15T00:00:00.000Z', '2025-03-30T12:00:00.000Z'],
      ]),
    )
    expect(await ctx.deps.sql`select 1 from outbox where user_id = ${gone.user.id} and type = 'plan.changed'`).toHaveLength(0)
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.events.user(gone.user.id))).toBe(0)

    await runInvoices(ctx.deps, new Date('2025-05-11T00:00:00.000Z'))
    expect(await invoiced(a.user.id)).toEqual([
      ['2025-01-10T12:00:00.000Z', 1000],
      ['2025-02-10T12:00:00.000Z', 1000],
      ['2025-03-10T12:00:00.000Z', 5000],
      ['2025-04-10T12:00:00.000Z', 2000],
    ])
    // B was told of the drop before the rise reached it: it never pays the higher price.
    expect(await invoiced(b.user.id)).toEqual([
      ['2025-01-30T12:00:00.000Z', 1000],
      ['2025-02-28T12:00:00.000Z', 1000],
      ['2025-03-30T12:00:00.000Z', 2000],
    ])
  })

  /**
   * A drop of every term in A's first period (to Feb 10), then every term back, on `backAt` or, with
   * none, in the same millisecond (the plan's row lock orders the two): the drop is billed for the
   * next period all the same, as its notice said, the rise back from the one after.
   */
  const dropTakenBack = async (backAt: string | null) => {
    const { plan, a } = await subscribedPlan('2025-01-10T12:00:00.000Z', { monthlyPriceCents: 1000, includedProxyCalls: 50, overagePerCallCents: 10 })
    try {
      at('2025-01-20T00:00:00.000Z')
      const drop = { monthlyPriceCents: 100, includedProxyCalls: 500, overagePerCallCents: 1 }
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: drop })).status).toBe(200)
      if (backAt) at(backAt)
      const back = { monthlyPriceCents: 1000, includedProxyCalls: 50, overagePerCallCents: 10 }
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: back })).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }
    const changes = await planChanges(a.user.id, 2)
    expect(changes.map(change => [change.terms.monthlyPriceCents, change.effectiveFrom])).toEqual([
      [100, '2025-02-10T12:00:00.000Z'],
      [1000, '2025-03-10T12:00:00.000Z'],
    ])
    await runInvoices(ctx.deps, new Date('2025-04-11T00:00:00.000Z'))
    expect(await invoiced(a.user.id)).toEqual([
      ['2025-01-10T12:00:00.000Z', 1000],
      ['2025-02-10T12:00:00.000Z', 100],
      ['2025-03-10T12:00:00.000Z', 1000],
    ])
    const periods = await ctx.deps.sql`
      select monthly_price_cents as monthly, included_proxy_calls as included, overage_per_call_cents as overage
      from subscription_periods where subscription_id = ${a.subscriptionId} and period_index < 3 order by period_index
    `
    expect(periods.map(p => [p.monthly, p.included, p.overage])).toEqual([
      [1000, 50, 10],
      [100, 500, 1],
      [1000, 50, 10],
    ])
  }

  test('a drop taken back within one period is billed for the next, as its notice said; the rise back from the one after', () =>
    dropTakenBack('2025-01-25T00:00:00.000Z'))

  test('a drop taken back in the same millisecond is still billed for the next period, as its notice said', () => dropTakenBack(null))

  const lockWaited = () => waitedForLock(ctx.deps.sql)
  const thousand = (participantId: string) => planBody(participantId, { monthlyPriceCents: 1000, includedProxyCalls: 0, overagePerCallCents: 0 })

  test('a rise that waited for a subscription being made is dated after it: the subscriber is told, and billed as told', async () => {
    const mine = await createAgent(ctx, owner)
    const user = await signUp(ctx)
    let release!: () => void
    const held = new Promise<void>(resolve => (release = resolve))
    let inserted!: () => void
    const insertedNow = new Promise<void>(resolve => (inserted = resolve))
    try {
      at('2025-01-10T12:00:00.000Z')
      const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(mine.id) })).body.data
      // A subscription made as POST /v1/billing/subscriptions makes it, held open before its commit.
      at('2025-01-10T13:00:00.000Z')
      const making = ctx.deps.sql.begin(async tx => {
        const found = (await findPlan(tx, plan.id, { lockAgent: true }))!
        await insertSubscription(tx, { userId: user.id, participantId: found.participantId, planId: found.id, startedAt: ctx.clock.now() })
        inserted()
        await held
      })
      await insertedNow
      // The owner's request came in a moment earlier, and waits for the plan's row.
      at('2025-01-10T12:59:59.000Z')
      const patching = ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { monthlyPriceCents: 5000 } })
      await lockWaited()
      at('2025-01-10T13:00:01.000Z')
      release()
      await making
      expect((await patching).status).toBe(200)
    } finally {
      release()
      ctx.clock.set(new Date())
    }
    const [change] = await planChanges(user.id, 1)
    expect(change.effectiveFrom).toBe('2025-03-10T13:00:00.000Z')
    await runInvoices(ctx.deps, new Date('2025-04-11T00:00:00.000Z'))
    expect(await invoiced(user.id)).toEqual([
      ['2025-01-10T13:00:00.000Z', 1000],
      ['2025-02-10T13:00:00.000Z', 1000],
      ['2025-03-10T13:00:00.000Z', 5000],
    ])
  })

  test('a subscription that waited for a rise being made starts after it, at the new terms: no rise comes untold', async () => {
    const mine = await createAgent(ctx, owner)
    const user = await signUp(ctx)
    let release!: () => void
    const held = new Promise<void>(resolve => (release = resolve))
    let changed!: () => void
    const changedNow = new Promise<void>(resolve => (changed = resolve))
    let subscribing: Promise<{ status: number; body: any }> | undefined
    try {
      at('2025-01-10T12:00:00.000Z')
      const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(mine.id) })).body.data
      // A rise made as PATCH /v1/billing/plans/{id} makes it, held open before its commit.
      at('2025-01-10T13:00:00.000Z')
      const changing = ctx.deps.sql.begin(async tx => {
        const now = ctx.clock.now()
        const change = (await updatePlan(tx, plan.id, { monthlyPriceCents: 5000 }, now))!
        await announcePlanChange(tx, { id: plan.id, name: plan.name, participantId: mine.id }, change, now)
        changed()
        await held
      })
      await changedNow
      // The subscriber's request came in a moment earlier.
      at('2025-01-10T12:59:59.000Z')
      subscribing = ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.id } })
      await lockWaited()
      at('2025-01-10T13:00:01.000Z')
      release()
      await changing
    } finally {
      release()
    }
    const subscribed = await subscribing
    ctx.clock.set(new Date())
    expect(subscribed.status).toBe(201)
    expect(subscribed.body.data.currentPeriodStart).toBe('2025-01-10T13:00:01.000Z')
    await runInvoices(ctx.deps, new Date('2025-04-11T00:00:00.000Z'))
    // Its first period has the terms it was shown when it started; none of them is a rise it was not told of.
    expect(await invoiced(user.id)).toEqual([
      ['2025-01-10T13:00:01.000Z', 5000],
      ['2025-02-10T13:00:01.000Z', 5000],
      ['2025-03-10T13:00:01.000Z', 5000],
    ])
  })

  test('a subscription that waited for the plan’s deactivation is refused: none starts after the plan left sale', async () => {
    const mine = await createAgent(ctx, owner)
    const user = await signUp(ctx)
    const plan = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(mine.id) })).body.data
    let release!: () => void
    const held = new Promise<void>(resolve => (release = resolve))
    let updated!: () => void
    const updatedNow = new Promise<void>(resolve => (updated = resolve))
    // A deactivation as DELETE /v1/billing/plans/{id} makes it, held open before its commit.
    const deactivating = ctx.deps.sql.begin(async tx => {
      await deactivatePlan(tx, plan.id, new Date())
      updated()
      await held
    })
    let subscribing: ReturnType<typeof ctx.call> | undefined
    try {
      await updatedNow
      subscribing = ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.id } })
      await lockWaited()
    } finally {
      release()
      await deactivating
    }
    expectError(await subscribing, 409, 'plan_inactive')
  })

  test('a plan created as its agent is deactivated is 404, never a 500, and is not written', async () => {
    const mine = await createAgent(ctx, owner)
    const held = await holdDeactivation(ctx.deps.sql, { id: mine.id, ownerId: owner.id })
    const creating = ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(mine.id) })
    await held.commitOnceWaited()
    expectError(await creating, 404, 'not_found')
    // Nothing written for the agent gone: no plan, no terms.
    const [written] = await ctx.deps.sql`
      select (select count(*)::int from plans where participant_id = ${mine.id}) as plans,
        (select count(*)::int from plan_terms t join plans p on p.id = t.plan_id where p.participant_id = ${mine.id}) as terms
    `
    expect(written).toEqual({ plans: 0, terms: 0 })
  })

  test('a plan changed as its agent is deactivated is 404 and left as it was, whichever commits first', async () => {
    const stored = async (id: string) =>
      (
        await ctx.deps
          .sql`select name, monthly_price_cents as price, (select count(*)::int from plan_terms where plan_id = ${id}) as terms from plans where id = ${id}`
      )[0]
    // The deactivation holds the agent's row, uncommitted, as the change runs: the change waits for it.
    const racing = await createAgent(ctx, owner)
    const first = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(racing.id) })).body.data
    const held = await holdDeactivation(ctx.deps.sql, { id: racing.id, ownerId: owner.id })
    const changing = ctx.call('PATCH', `/v1/billing/plans/${first.id}`, { token: owner.token, body: { name: 'Late', monthlyPriceCents: 1 } })
    await held.commitOnceWaited()
    expectError(await changing, 404, 'not_found')
    expect(await stored(first.id)).toEqual({ name: 'Pro', price: 1000, terms: 1 })
    // The change passed its check and waits for the plan's row while the deactivation commits.
    const earlier = await createAgent(ctx, owner)
    const second = (await ctx.call('POST', '/v1/billing/plans', { token: owner.token, body: thousand(earlier.id) })).body.data
    const release = await holdOpen(ctx.deps.sql, tx => tx`select 1 from plans where id = ${second.id} for update`)
    let late: ReturnType<typeof ctx.call>
    try {
      late = ctx.call('PATCH', `/v1/billing/plans/${second.id}`, { token: owner.token, body: { name: 'Late', monthlyPriceCents: 1 } })
      await waitedForLock(ctx.deps.sql)
      expect((await ctx.call('DELETE', `/v1/participants/${earlier.id}`, { token: owner.token })).status).toBe(200)
    } finally {
      await release()
    }
    expectError(await late, 404, 'not_found')
    expect(await stored(second.id)).toEqual({ name: 'Pro', price: 1000, terms: 1 })
  })

  test('fewer included calls or a higher overage is a rise; with a lower monthly price each term takes its own date', async () => {
    const { plan, a } = await subscribedPlan('2025-06-01T00:00:00.000Z', { monthlyPriceCents: 1000, includedProxyCalls: 100, overagePerCallCents: 5 })
    try {
      at('2025-06-10T00:00:00.000Z')
      const body = { monthlyPriceCents: 800, includedProxyCalls: 10, overagePerCallCents: 100_000 }
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body })).status).toBe(200)
      // A name alone changes no terms: nobody is told.
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body: { name: 'Pro' } })).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }
    const [change] = await planChanges(a.user.id, 1)
    expect(change.effectiveFrom).toBe('2025-08-01T00:00:00.000Z')
    await runInvoices(ctx.deps, new Date('2025-09-01T00:01:01.000Z'))
    expect(await periodTerms(a.subscriptionId)).toEqual([
      ['2025-06-01T00:00:00.000Z', 1000, 100, 5],
      ['2025-07-01T00:00:00.000Z', 800, 100, 5],
      ['2025-08-01T00:00:00.000Z', 800, 10, 100_000],
      ['2025-09-01T00:00:00.000Z', 800, 10, 100_000],
    ])
    expect((await planChanges(a.user.id, 1)).length).toBe(1)
  })

  test('a change made at the very instant a period begins falls in that period: a drop is billed from the next, as told', async () => {
    const { plan, a } = await subscribedPlan('2027-01-31T23:59:59.999Z', { monthlyPriceCents: 1000, includedProxyCalls: 100, overagePerCallCents: 5 })
    try {
      // The first period ends, and the second begins, at this instant.
      at('2027-02-28T23:59:59.999Z')
      const body = { monthlyPriceCents: 200, includedProxyCalls: 500, overagePerCallCents: 1 }
      expect((await ctx.call('PATCH', `/v1/billing/plans/${plan.id}`, { token: owner.token, body })).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }
    const [change] = await planChanges(a.user.id, 1)
    expect(change.effectiveFrom).toBe('2027-03-31T23:59:59.999Z')
    await runInvoices(ctx.deps, new Date('2027-05-01T00:01:00.000Z'))
    expect(await periodTerms(a.subscriptionId)).toEqual([
      ['2027-01-31T23:59:59.999Z', 1000, 100, 5],
      ['2027-02-28T23:59:59.999Z', 1000, 100, 5],
      ['2027-03-31T23:59:59.999Z', 200, 500, 1],
      ['2027-04-30T23:59:59.999Z', 200, 500, 1],
    ])
  })
})
