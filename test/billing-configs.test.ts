import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { listConfigs } from '../src/billing/configs/store.ts'
import {
  createAgent,
  createTestContext,
  expectError,
  halfAMillisecondAfter,
  idsBefore,
  signUp,
  type TestAgent,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { holdDeactivation, lockWaited } from './helpers/deactivation.ts'
import { holdOpen } from './helpers/held-transaction.ts'

let ctx: TestContext
let owner: TestUser
let agent: TestAgent

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  agent = await createAgent(ctx, owner)
})
afterAll(() => ctx.close())

const listing = (extra: Record<string, unknown> = {}) => ({
  participantId: agent.id,
  name: 'Cursor rules',
  description: 'Rules for the editor',
  priceCents: 499,
  fileType: '.cursorrules',
  content: 'SECRET CONTENT',
  previewSnippet: 'Rules...',
  ...extra,
})

async function newConfig(extra: Record<string, unknown> = {}) {
  const res = await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing(extra) })
  if (res.status !== 201) throw new Error(JSON.stringify(res.body))
  return res.body.data
}

/**
 * Runs `request` while the agent's deactivation (as DELETE /v1/participants/{id} makes it) is held open
 * before its commit, with `configId`'s row locked too when given; commits once the request waits.
 */
async function whileDeactivating(agentId: string, request: () => ReturnType<typeof ctx.call>, configId?: string) {
  const held = await holdDeactivation(ctx.deps.sql, { id: agentId, ownerId: owner.id }, tx =>
    configId ? tx`select 1 from config_listings where id = ${configId} for update` : Promise.resolve(),
  )
  const requesting = request()
  await held.commitOnceWaited()
  return requesting
}

const priceOf = async (id: string) => (await ctx.deps.sql`select price_cents as price from config_listings where id = ${id}`)[0]!.price

describe('config listings', () => {
  test('the owner creates one (201, content shown to the owner)', async () => {
    const res = await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing() })
    expect(res.status).toBe(201)
    expect(res.body.data).toMatchObject({ ...listing(), active: true })
  })

  test('field limits: fileType pattern, previewSnippet 500, content 1,000,000, body up to 2 MiB', async () => {
    for (const body of [
      listing({ fileType: 'has space' }),
      listing({ fileType: 'x'.repeat(65) }),
      listing({ previewSnippet: 'x'.repeat(501) }),
      listing({ content: 'x'.repeat(1_000_001) }),
      listing({ priceCents: -1 }),
      listing({ name: '' }),
    ]) {
      expectError(await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body }), 400, 'validation_failed')
    }
    expect((await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ content: 'y'.repeat(1_000_000) }) })).status).toBe(
      201,
    )
    const huge = JSON.stringify(listing({ content: 'z'.repeat(2_200_000) }))
    expectError(
      await ctx.call('POST', '/v1/billing/configs', { token: owner.token, rawBody: huge, headers: { 'content-length': String(huge.length) } }),
      413,
      'payload_too_large',
    )
    const [row] = await ctx.deps.sql`select count(*)::int as n from config_listings where participant_id = ${agent.id} and content like 'z%'`
    expect(row!.n).toBe(0)
  })

  test('the list hides content from non-buyers, shows it to buyers and the owner; inactive ones only to the owner', async () => {
    const fresh = await createAgent(ctx, owner)
    const a = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: fresh.id, name: 'A' }) })).body.data
    const b = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: fresh.id, name: 'B' }) })).body.data
    const buyer = await signUp(ctx)
    await ctx.call('POST', `/v1/billing/configs/${a.id}/purchase`, { token: buyer.token })
    await ctx.call('DELETE', `/v1/billing/configs/${b.id}`, { token: owner.token })
    const stranger = await signUp(ctx)
    const forStranger = (await ctx.call('GET', `/v1/billing/configs/${fresh.id}`, { token: stranger.token })).body.data
    expect(forStranger.map((c: { id: string }) => c.id)).toEqual([a.id])
    expect(forStranger[0].content).toBeUndefined()
    const forBuyer = (await ctx.call('GET', `/v1/billing/configs/${fresh.id}`, { token: buyer.token })).body.data
    expect(forBuyer[0].content).toBe('SECRET CONTENT')
    const forOwner = (await ctx.call('GET', `/v1/billing/configs/${fresh.id}`, { token: owner.token })).body.data
    // Oldest first, ties (same millisecond) by id: compare in creation order by name.
    const byName = [...forOwner].sort((x: { name: string }, y: { name: string }) => x.name.localeCompare(y.name))
    expect(byName.map((c: { id: string; active: boolean; content: string }) => [c.id, c.active, c.content])).toEqual([
      [a.id, true, 'SECRET CONTENT'],
      [b.id, false, 'SECRET CONTENT'],
    ])
    const forAgent = (await ctx.call('GET', `/v1/billing/configs/${fresh.id}`, { apiKey: fresh.apiKey })).body.data
    expect(forAgent[0].content).toBeUndefined()
  })

  test('a listing created or changed as its agent is deactivated is 404, never a 500; none is created, none changed', async () => {
    const creating = await createAgent(ctx, owner)
    const created = whileDeactivating(creating.id, () =>
      ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: creating.id }) }),
    )
    expectError(await created, 404, 'not_found')
    const [written] = await ctx.deps.sql`select count(*)::int as n from config_listings where participant_id = ${creating.id}`
    expect(written!.n).toBe(0)
    const changing = await createAgent(ctx, owner)
    const config = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: changing.id }) })).body.data
    const changed = whileDeactivating(
      changing.id,
      () => ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: owner.token, body: { priceCents: 1 } }),
      config.id,
    )
    expectError(await changed, 404, 'not_found')
    expect(await priceOf(config.id)).toBe(499)
  })

  test('a listing changed as its agent is deactivated is 404 and left as it was, whichever commits first', async () => {
    // The deactivation holds only the agent's row, uncommitted, as the change runs: the change waits for it.
    const racing = await createAgent(ctx, owner)
    const first = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: racing.id }) })).body.data
    const changed = whileDeactivating(racing.id, () =>
      ctx.call('PATCH', `/v1/billing/configs/${first.id}`, { token: owner.token, body: { priceCents: 1 } }),
    )
    expectError(await changed, 404, 'not_found')
    expect(await priceOf(first.id)).toBe(499)
    // The change passed its check and waits for the listing's row while the deactivation commits.
    const earlier = await createAgent(ctx, owner)
    const second = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: earlier.id }) })).body.data
    const release = await holdOpen(ctx.deps.sql, tx => tx`select 1 from config_listings where id = ${second.id} for update`)
    let late: ReturnType<typeof ctx.call>
    try {
      late = ctx.call('PATCH', `/v1/billing/configs/${second.id}`, { token: owner.token, body: { priceCents: 1 } })
      await lockWaited(ctx.deps.sql)
      expect((await ctx.call('DELETE', `/v1/participants/${earlier.id}`, { token: owner.token })).status).toBe(200)
    } finally {
      await release()
    }
    expectError(await late, 404, 'not_found')
    expect(await priceOf(second.id)).toBe(499)
  })

  test('patch and delete are owner-only (403) and unknown ids are 404', async () => {
    const config = await newConfig()
    const other = await signUp(ctx)
    expectError(await ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: other.token, body: { priceCents: 1 } }), 403, 'forbidden')
    expectError(await ctx.call('DELETE', `/v1/billing/configs/${config.id}`, { token: other.token }), 403, 'forbidden')
    expectError(await ctx.call('POST', '/v1/billing/configs', { token: other.token, body: listing() }), 403, 'forbidden')
    const patched = await ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: owner.token, body: { priceCents: 999, content: 'v2' } })
    expect(patched.body.data).toMatchObject({ priceCents: 999, content: 'v2' })
    expectError(
      await ctx.call('PATCH', '/v1/billing/configs/00000000-0000-4000-8000-000000000000', { token: owner.token, body: {} }),
      404,
      'not_found',
    )
    expect((await ctx.call('DELETE', `/v1/billing/configs/${config.id}`, { token: owner.token })).body.data).toEqual({ id: config.id, active: false })
  })
})

describe('purchases', () => {
  test('purchases made together are dated a millisecond apart, so paging invoices by `before` skips none', async () => {
    const configs = await Promise.all(Array.from({ length: 6 }, (_, i) => newConfig({ name: `Together ${i}` })))
    const buyer = await signUp(ctx)
    // One instant for every purchase: each invoice's time must come from the ones committed before it.
    ctx.clock.set(new Date())
    try {
      const bought = await Promise.all(configs.map(c => ctx.call('POST', `/v1/billing/configs/${c.id}/purchase`, { token: buyer.token })))
      expect(bought.map(b => b.status)).toEqual(configs.map(() => 201))
    } finally {
      ctx.clock.set(new Date())
    }
    const seen: string[] = []
    let before = ''
    for (;;) {
      const page = (await ctx.call('GET', `/v1/billing/invoices?limit=1${before}`, { token: buyer.token })).body.data
      if (page.length === 0) break
      seen.push(page[0].issuedAt)
      before = `&before=${encodeURIComponent(page[0].issuedAt)}`
    }
    expect(seen.length).toBe(configs.length)
    expect(new Set(seen).size).toBe(configs.length)
  })

  test('an invoice is older than a `before` finer than a millisecond in its millisecond: listed, as it is not at its own time', async () => {
    const config = await newConfig({ name: 'Finer' })
    const buyer = await signUp(ctx)
    const invoiceId = (await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })).body.data.invoiceId
    const [invoice] = (await ctx.call('GET', '/v1/billing/invoices', { token: buyer.token })).body.data
    expect(await idsBefore(ctx, '/v1/billing/invoices', { token: buyer.token }, halfAMillisecondAfter(invoice.issuedAt))).toEqual([invoiceId])
    expect(await idsBefore(ctx, '/v1/billing/invoices', { token: buyer.token }, invoice.issuedAt)).toEqual([])
  })

  test('first purchase 201 with content and the price paid; again 200 with the same purchase', async () => {
    const config = await newConfig({ priceCents: 700 })
    const buyer = await signUp(ctx)
    const first = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })
    expect(first.status).toBe(201)
    expect(first.body.data).toMatchObject({ configId: config.id, priceCents: 700, content: 'SECRET CONTENT' })
    expect(first.body.data.invoiceId).toMatch(/^[0-9a-f-]{36}$/)
    const invoices = (await ctx.call('GET', '/v1/billing/invoices', { token: buyer.token })).body.data
    expect(invoices).toMatchObject([
      {
        id: first.body.data.invoiceId,
        participantId: agent.id,
        subscriptionId: null,
        lines: [{ kind: 'config_purchase', quantity: 1, unitPriceCents: 700, amountCents: 700 }],
        totalCents: 700,
        status: 'issued',
      },
    ])
    await ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: owner.token, body: { priceCents: 900, content: 'NEW' } })
    const again = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })
    expect(again.status).toBe(200)
    expect(again.body.data.purchaseId).toBe(first.body.data.purchaseId)
    expect(again.body.data.priceCents).toBe(700)
    expect(again.body.data.invoiceId).toBe(first.body.data.invoiceId)
    expect((await ctx.call('GET', '/v1/billing/invoices', { token: buyer.token })).body.data.length).toBe(1)
    const mine = await ctx.call('GET', '/v1/billing/my-configs', { token: buyer.token })
    expect(mine.body.data).toEqual([
      {
        purchaseId: first.body.data.purchaseId,
        configId: config.id,
        participantId: agent.id,
        name: 'Cursor rules',
        fileType: '.cursorrules',
        priceCents: 700,
        content: 'NEW',
        purchasedAt: first.body.data.purchasedAt,
      },
    ])
  })

  test('own listing 403, inactive 409, unknown 404; a buyer keeps access after deactivation', async () => {
    const config = await newConfig()
    expectError(await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: owner.token }), 403, 'cannot_buy_own_config')
    const buyer = await signUp(ctx)
    await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })
    await ctx.call('DELETE', `/v1/billing/configs/${config.id}`, { token: owner.token })
    const late = await signUp(ctx)
    expectError(await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: late.token }), 409, 'config_inactive')
    expect((await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })).status).toBe(200)
    expectError(await ctx.call('POST', '/v1/billing/configs/00000000-0000-4000-8000-000000000000/purchase', { token: late.token }), 404, 'not_found')
    expect((await ctx.call('GET', '/v1/billing/my-configs', { token: late.token })).body.data).toEqual([])
  })

  test('buying again after the agent was deactivated answers the same purchase (200, nothing charged); others get 404', async () => {
    // The contract: buying again returns the same purchase with 200 and charges nothing; a deactivated
    // agent's data stays. A buyer retrying a purchase whose answer it lost must not read "not found".
    const gone = await createAgent(ctx, owner)
    const config = (await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: gone.id }) })).body.data
    const buyer = await signUp(ctx)
    const first = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })
    expect(first.status).toBe(201)
    expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
    const again = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })
    expect(again.status).toBe(200)
    expect(again.body.data).toEqual(first.body.data)
    const late = await signUp(ctx)
    expectError(await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: late.token }), 404, 'not_found')
    const [charged] = await ctx.deps.sql`select count(*)::int as n from invoices where participant_id = ${gone.id}`
    expect(charged!.n).toBe(1)
  })

  test('a purchase that waited for its agent’s deactivation is refused (404): nothing sold or invoiced', async () => {
    const mine = await createAgent(ctx, owner)
    const res = await ctx.call('POST', '/v1/billing/configs', { token: owner.token, body: listing({ participantId: mine.id }) })
    const buyer = await signUp(ctx)
    const buying = whileDeactivating(mine.id, () => ctx.call('POST', `/v1/billing/configs/${res.body.data.id}/purchase`, { token: buyer.token }))
    expectError(await buying, 404, 'not_found')
    const [nothing] = await ctx.deps.sql`
      select (select count(*)::int from config_purchases where user_id = ${buyer.id}) as purchases,
        (select count(*)::int from invoices where participant_id = ${mine.id}) as invoices
    `
    expect(nothing).toEqual({ purchases: 0, invoices: 0 })
  })

  test('50 concurrent purchases of one config by one user create one purchase', async () => {
    const config = await newConfig()
    const buyer = await signUp(ctx)
    const results = await Promise.all(
      Array.from({ length: 50 }, () => ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token })),
    )
    expect(results.filter(r => r.status === 201).length).toBe(1)
    expect(results.filter(r => r.status === 200).length).toBe(49)
    expect(new Set(results.map(r => r.body.data.purchaseId)).size).toBe(1)
    const [row] = await ctx.deps.sql`select count(*)::int as n from config_purchases where config_id = ${config.id}`
    expect(row!.n).toBe(1)
  })

  test('expectedPriceCents: another price is 409 price_changed and charges nothing; the price expected is charged', async () => {
    const config = await newConfig({ priceCents: 500 })
    const buyer = await signUp(ctx)
    const buy = (body?: unknown) => ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token, body })
    await ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: owner.token, body: { priceCents: 100_000 } })
    const refused = expectError(await buy({ expectedPriceCents: 500 }), 409, 'price_changed')
    expect(refused.message).toContain('100000')
    for (const body of [{ expectedPriceCents: -1 }, { expectedPriceCents: '500' }, { expectedPriceCents: 1.5 }, { price: 500 }, 'deny']) {
      expectError(await buy(body), 400, 'validation_failed')
    }
    const [nothing] = await ctx.deps.sql`
      select (select count(*)::int from config_purchases where user_id = ${buyer.id}) as purchases,
        (select count(*)::int from invoices where user_id = ${buyer.id}) as invoices
    `
    expect(nothing).toEqual({ purchases: 0, invoices: 0 })

    const bought = await buy({ expectedPriceCents: 100_000 })
    expect(bought.status).toBe(201)
    expect(bought.body.data.priceCents).toBe(100_000)
    // An empty object, like no body, asks for no check.
    expect((await ctx.call('POST', `/v1/billing/configs/${(await newConfig()).id}/purchase`, { token: buyer.token, body: {} })).status).toBe(201)
  })

  test('Idempotency-Key replays the first 201', async () => {
    const config = await newConfig()
    const buyer = await signUp(ctx)
    const headers = { 'idempotency-key': 'buy-1' }
    const first = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token, headers })
    const again = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: buyer.token, headers })
    expect([first.status, again.status]).toEqual([201, 201])
    expect(again.body).toEqual(first.body)
    const other = await newConfig()
    expectError(await ctx.call('POST', `/v1/billing/configs/${other.id}/purchase`, { token: buyer.token, headers }), 409, 'idempotency_key_reused')
  })
})

describe('creator stats', () => {
  test('counts subscribers, sales, config revenue and ratings of the caller’s agents only', async () => {
    const creator = await signUp(ctx)
    const one = await createAgent(ctx, creator)
    const two = await createAgent(ctx, creator)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: creator.token,
      body: { participantId: one.id, name: 'P', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const config = await ctx.call('POST', '/v1/billing/configs', {
      token: creator.token,
      body: { participantId: two.id, name: 'C', priceCents: 250, fileType: 'md', content: 'c' },
    })
    const u1 = await signUp(ctx)
    const u2 = await signUp(ctx)
    for (const u of [u1, u2]) await ctx.call('POST', '/v1/billing/subscriptions', { token: u.token, body: { planId: plan.body.data.id } })
    for (const u of [u1, u2]) await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: u.token })
    await ctx.call('POST', '/v1/billing/reviews', { token: u1.token, body: { participantId: one.id, rating: 4 } })
    const res = await ctx.call('GET', '/v1/billing/creator-stats', { token: creator.token })
    expect(res.status).toBe(200)
    expect(res.body.data.totals).toEqual({ revenueCents: 500, activeSubscribers: 2, configSales: 2 })
    expect(res.body.data.agents).toEqual([
      {
        participantId: one.id,
        name: one.name,
        activeSubscribers: 2,
        revenueCents: 0,
        revenueThisMonthCents: 0,
        configSales: 0,
        configRevenueCents: 0,
        proxyCallsThisMonth: 0,
        rating: { average: 4, count: 1 },
      },
      {
        participantId: two.id,
        name: two.name,
        activeSubscribers: 0,
        revenueCents: 500,
        revenueThisMonthCents: 500,
        configSales: 2,
        configRevenueCents: 500,
        proxyCallsThisMonth: 0,
        rating: { average: null, count: 0 },
      },
    ])
    const nobody = await signUp(ctx)
    expect((await ctx.call('GET', '/v1/billing/creator-stats', { token: nobody.token })).body.data).toEqual({
      totals: { revenueCents: 0, activeSubscribers: 0, configSales: 0 },
      agents: [],
    })
  })
})

describe('reading an agent’s listings', () => {
  test('content is read from Postgres only for its owner and buyers', async () => {
    const config = await newConfig({ name: 'Unread' })
    const stranger = await signUp(ctx)
    const rows = async (reader: string | null) => (await listConfigs(ctx.deps.sql, agent.id, reader, false)).find(row => row.id === config.id)!
    expect((await rows(stranger.id)).content).toBeNull()
    expect((await rows(null)).content).toBeNull()
    expect((await rows(owner.id)).content).toBe('SECRET CONTENT')
    const bought = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: stranger.token })
    expect(bought.status).toBe(201)
    expect((await rows(stranger.id)).content).toBe('SECRET CONTENT')
  })
})
