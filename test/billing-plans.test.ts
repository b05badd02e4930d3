import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'

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
