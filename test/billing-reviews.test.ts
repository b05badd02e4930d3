import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
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

let ctx: TestContext
let owner: TestUser
let agent: TestAgent
let planId: string

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  agent = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'Basic', monthlyPriceCents: 1000, includedProxyCalls: 10, overagePerCallCents: 1 },
  })
  planId = plan.body.data.id
})
afterAll(() => ctx.close())

async function customer(): Promise<TestUser> {
  const user = await signUp(ctx)
  const res = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
  if (res.status !== 201) throw new Error(JSON.stringify(res.body))
  return user
}

const review = (user: TestUser, body: Record<string, unknown>) =>
  ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, ...body } })

describe('writing reviews', () => {
  test('a subscriber creates a review (201); a second POST updates it (200); aggregates follow', async () => {
    const fresh = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const a = await signUp(ctx)
    const b = await signUp(ctx)
    for (const u of [a, b]) await ctx.call('POST', '/v1/billing/subscriptions', { token: u.token, body: { planId: plan.body.data.id } })
    const created = await ctx.call('POST', '/v1/billing/reviews', { token: a.token, body: { participantId: fresh.id, rating: 5, comment: 'Great' } })
    expect(created.status).toBe(201)
    expect(created.body.data).toMatchObject({ participantId: fresh.id, userId: a.id, rating: 5, comment: 'Great' })
    await ctx.call('POST', '/v1/billing/reviews', { token: b.token, body: { participantId: fresh.id, rating: 2 } })
    let p = (await ctx.call('GET', `/v1/participants/${fresh.id}`)).body.data
    expect(p.rating).toEqual({ average: 3.5, count: 2 })
    ctx.clock.advance(1000)
    const updated = await ctx.call('POST', '/v1/billing/reviews', { token: a.token, body: { participantId: fresh.id, rating: 3, comment: 'Fine' } })
    expect(updated.status).toBe(200)
    expect(updated.body.data.id).toBe(created.body.data.id)
    expect(updated.body.data).toMatchObject({ rating: 3, comment: 'Fine', createdAt: created.body.data.createdAt })
    expect(updated.body.data.updatedAt > created.body.data.updatedAt).toBe(true)
    p = (await ctx.call('GET', `/v1/participants/${fresh.id}`)).body.data
    expect(p.rating).toEqual({ average: 2.5, count: 2 })
    const [row] = await ctx.deps.sql`select count(*)::int as n from reviews where participant_id = ${fresh.id}`
    expect(row!.n).toBe(2)
  })

  test.each([0, 6, 2.5, '5'])('refuses rating %p with 400', async rating => {
    const user = await customer()
    const body = expectError(await review(user, { rating }), 400, 'validation_failed')
    expect(body.details.some((d: { path: string }) => d.path === '/rating')).toBe(true)
  })

  test('accepts a 1000-character comment and refuses 1001', async () => {
    const user = await customer()
    expect((await review(user, { rating: 4, comment: 'x'.repeat(1000) })).status).toBe(201)
    expectError(await review(user, { rating: 4, comment: 'x'.repeat(1001) }), 400, 'validation_failed')
    const [row] = await ctx.deps.sql`select length(comment) as n from reviews where user_id = ${user.id}`
    expect(row!.n).toBe(1000)
  })

  test('refuses non-customers (403 not_a_customer), the owner (403) and unknown agents (404)', async () => {
    const stranger = await signUp(ctx)
    expectError(await review(stranger, { rating: 5 }), 403, 'not_a_customer')
    expectError(await review(owner, { rating: 5 }), 403, 'cannot_review_own_agent')
    expectError(
      await ctx.call('POST', '/v1/billing/reviews', {
        token: stranger.token,
        body: { participantId: '00000000-0000-4000-8000-000000000000', rating: 5 },
      }),
      404,
      'not_found',
    )
    expectError(
      await ctx.call('POST', '/v1/billing/reviews', { apiKey: agent.apiKey, body: { participantId: agent.id, rating: 5 } }),
      403,
      'forbidden',
    )
  })

  test('a former subscriber and a config buyer are customers', async () => {
    const former = await customer()
    const sub = (await ctx.call('GET', '/v1/billing/subscriptions', { token: former.token })).body.data[0]
    await ctx.call('DELETE', `/v1/billing/subscriptions/${sub.id}`, { token: former.token })
    expect((await review(former, { rating: 4 })).status).toBe(201)
    const config = await ctx.call('POST', '/v1/billing/configs', {
      token: owner.token,
      body: { participantId: agent.id, name: 'Rules', priceCents: 100, fileType: '.cursorrules', content: 'be nice' },
    })
    const buyer = await signUp(ctx)
    await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: buyer.token })
    expect((await review(buyer, { rating: 5 })).status).toBe(201)
  })
})

describe('listing reviews', () => {
  test('newest first, default 20, max 100, before pages, reviewers by id only', async () => {
    const fresh = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const ids: string[] = []
    for (let i = 0; i < 23; i++) {
      const u = await signUp(ctx)
      await ctx.call('POST', '/v1/billing/subscriptions', { token: u.token, body: { planId: plan.body.data.id } })
      ctx.clock.advance(10)
      const r = await ctx.call('POST', '/v1/billing/reviews', { token: u.token, body: { participantId: fresh.id, rating: 1 + (i % 5) } })
      ids.push(r.body.data.id)
    }
    const reader = await signUp(ctx)
    const page = await ctx.call('GET', `/v1/billing/reviews/${fresh.id}`, { token: reader.token })
    expect(page.status).toBe(200)
    expect(page.body.data.length).toBe(20)
    expect(page.body.data.map((r: { id: string }) => r.id)).toEqual(ids.slice(-20).reverse())
    expect(JSON.stringify(page.body.data)).not.toContain('@example.com')
    const rest = await ctx.call('GET', `/v1/billing/reviews/${fresh.id}?before=${encodeURIComponent(page.body.data[19].createdAt)}`, {
      token: reader.token,
    })
    expect(rest.body.data.map((r: { id: string }) => r.id)).toEqual(ids.slice(0, 3).reverse())
    expect((await ctx.call('GET', `/v1/billing/reviews/${fresh.id}?limit=100`, { token: reader.token })).body.data.length).toBe(23)
    expect((await ctx.call('GET', `/v1/billing/reviews/${fresh.id}?limit=2`, { token: reader.token })).body.data.length).toBe(2)
    for (const bad of ['0', '101', 'abc', '-1', '1.5']) {
      expectError(await ctx.call('GET', `/v1/billing/reviews/${fresh.id}?limit=${bad}`, { token: reader.token }), 400, 'validation_failed')
    }
    expectError(await ctx.call('GET', `/v1/billing/reviews/${fresh.id}`), 401, 'unauthorized')
    expectError(await ctx.call('GET', '/v1/billing/reviews/00000000-0000-4000-8000-000000000000', { token: reader.token }), 404, 'not_found')
  })

  test('reviews written at once are dated a millisecond apart, so paging them by `before` skips none', async () => {
    const fresh = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const users: TestUser[] = []
    for (let i = 0; i < 5; i++) {
      const u = await signUp(ctx)
      await ctx.call('POST', '/v1/billing/subscriptions', { token: u.token, body: { planId: plan.body.data.id } })
      users.push(u)
    }
    ctx.clock.freeze(new Date())
    let written: string[]
    try {
      const results = await Promise.all(
        users.map(u => ctx.call('POST', '/v1/billing/reviews', { token: u.token, body: { participantId: fresh.id, rating: 4 } })),
      )
      written = results.map(r => r.body.data.id)
    } finally {
      ctx.clock.resume()
    }
    const seen = await idsPagedByBefore(ctx, `/v1/billing/reviews/${fresh.id}`, { token: owner.token })
    expect(seen.sort()).toEqual(written.sort())
  })

  test('a review is older than a `before` finer than a millisecond in its millisecond: listed, as it is not at its own time', async () => {
    const fresh = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const user = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
    const written = (await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: fresh.id, rating: 4 } })).body.data
    const path = `/v1/billing/reviews/${fresh.id}`
    expect(await idsBefore(ctx, path, { token: owner.token }, halfAMillisecondAfter(written.createdAt))).toEqual([written.id])
    expect(await idsBefore(ctx, path, { token: owner.token }, written.createdAt)).toEqual([])
  })

  test('a review of the last millisecond of year 9999 is older than a `before` finer than that millisecond: listed', async () => {
    const fresh = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const user = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
    ctx.clock.freeze(new Date('9999-12-31T23:59:59.999Z'))
    let written: { id: string; createdAt: string }
    try {
      written = (await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: fresh.id, rating: 4 } })).body.data
    } finally {
      ctx.clock.set(new Date())
    }
    expect(written.createdAt).toBe('9999-12-31T23:59:59.999Z')
    const path = `/v1/billing/reviews/${fresh.id}`
    expect(await idsBefore(ctx, path, { token: owner.token }, '9999-12-31T23:59:59.9999Z')).toEqual([written.id])
    expect(await idsBefore(ctx, path, { token: owner.token }, written.createdAt)).toEqual([])
  })

  test('a review dated after its write (written at once with others) is never updated before it was created', async () => {
    const users = [await customer(), await customer(), await customer()]
    ctx.clock.freeze(new Date())
    try {
      // Written at one instant: all but the first are dated a millisecond or more after it.
      await Promise.all(users.map(u => review(u, { rating: 4 })))
      for (const u of users) {
        const updated = (await review(u, { rating: 2 })).body.data
        expect(Date.parse(updated.updatedAt)).toBeGreaterThanOrEqual(Date.parse(updated.createdAt))
      }
    } finally {
      ctx.clock.resume()
    }
  })
})
