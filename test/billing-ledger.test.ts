/**
 * The billing checked against an independent model of the contract (helpers/billing-model.ts):
 * every invoice, line and total a subscriber sees, every figure a creator sees, after seeded random
 * sequences of subscribing, cancelling, price changes, proxy calls and purchases, driven through the
 * HTTP API, the metering worker and the invoice worker, across month ends and skipped runs; then the
 * edges of periods and the extremes of the numbers the API accepts.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import type { Job } from 'bullmq'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { startWorker } from './helpers/workers.ts'
import { seeded, type Random } from './helpers/seeded.ts'
import { meteringProcessor } from '../workers/metering.ts'
import { invoiceProcessor } from '../workers/invoices.ts'
import {
  dayMs,
  expectedInvoices,
  periodIndexOf,
  periodStart,
  termsOf,
  type Line,
  type ModelInvoice,
  type ModelPlan,
  type ModelPurchase,
  type ModelSubscription,
  type Terms,
} from './helpers/billing-model.ts'

let ctx: TestContext
let upstream: Upstream
let metering: { stop(): Promise<void> }
const roomy = { capacity: 100_000, perSeconds: 1 }
const limits = ['proxyCall', 'subscriptionCreate', 'configPurchase', 'planWrite', 'configWrite', 'participantCreate', 'connectionCreate']

beforeAll(async () => {
  ctx = await createTestContext({
    env: {
      PROXY_ALLOWED_HOSTS: '127.0.0.1',
      CONNECTIONS_KEY: randomBytes(32).toString('hex'),
      RATE_LIMITS: JSON.stringify(Object.fromEntries(limits.map(name => [name, roomy]))),
    },
  })
  upstream = startUpstream()
  metering = await startWorker(ctx.deps, 'metering', meteringProcessor(ctx.deps))
})
afterAll(async () => {
  await metering.stop()
  upstream.stop()
  await ctx.close()
})

// ---- Driving the service ------------------------------------------------------------------------

interface World {
  owner: TestUser
  agents: TestAgent[]
  planIds: string[]
  plans: ModelPlan[]
  configs: { id: string; agent: number; price: number }[]
  /** Plans and configs taken off sale. */
  inactive: Set<string>
  users: TestUser[]
  subscriptions: ModelSubscription[]
  purchases: ModelPurchase[]
  runs: Date[]
}

const randomTerms = (random: Random): Terms => ({
  monthly: random.pick([0, 1, 99, 1000, 4999, 10_000_000]),
  included: random.pick([0, 1, 2, 5]),
  overage: random.pick([0, 1, 7, 100_000]),
})
const termsBody = (terms: Terms) => ({ monthlyPriceCents: terms.monthly, includedProxyCalls: terms.included, overagePerCallCents: terms.overage })

/** Moves the clock to `when` and stops it there: every write is dated exactly. */
const at = (when: Date) => ctx.clock.freeze(when)
const now = () => ctx.clock.now()
const tick = (ms = 1) => at(new Date(now().getTime() + ms))

async function ok(res: Promise<{ status: number; body: any }>, status = 200) {
  const done = await res
  if (done.status !== status) throw new Error(`expected ${status}, got ${done.status} ${JSON.stringify(done.body)}`)
  return done.body.data
}

async function createPlan(owner: TestUser, agent: TestAgent, terms: Terms) {
  const body = { participantId: agent.id, name: 'Plan', ...termsBody(terms) }
  return ok(ctx.call('POST', '/v1/billing/plans', { token: owner.token, body }), 201)
}

async function createConfig(owner: TestUser, agent: TestAgent, price: number) {
  const body = { participantId: agent.id, name: `Config ${price}`, priceCents: price, fileType: 'yaml', content: `price: ${price}` }
  return ok(ctx.call('POST', '/v1/billing/configs', { token: owner.token, body }), 201)
}

/** A user with a connection to the upstream, for proxy calls. */
async function connectedUser() {
  const user = await signUp(ctx)
  const body = { provider: 'acme', baseUrl: `${upstream.url}/api`, credential: 'secret' }
  await ok(ctx.call('POST', '/v1/connections', { token: user.token, body }), 201)
  return user
}

const emptyWorld = (owner: TestUser): World => ({
  owner,
  agents: [],
  planIds: [],
  plans: [],
  configs: [],
  inactive: new Set(),
  users: [],
  subscriptions: [],
  purchases: [],
  runs: [],
})

async function createWorld(random: Random, agents: number, users: number): Promise<World> {
  const owner = await signUp(ctx)
  const world = emptyWorld(owner)
  for (let i = 0; i < agents; i++) {
    const agent = await createAgent(ctx, owner)
    const terms = randomTerms(random)
    world.agents.push(agent)
    world.planIds.push((await createPlan(owner, agent, terms)).id)
    world.plans.push({ versions: [{ from: now(), terms }] })
    for (const price of [random.pick([0, 1, 250, 10_000_000]), random.pick([5, 999])]) {
      world.configs.push({ id: (await createConfig(owner, agent, price)).id, agent: i, price })
    }
    tick()
  }
  for (let i = 0; i < users; i++) world.users.push(await connectedUser())
  return world
}

const active = (world: World, user: number, agent: number) =>
  world.subscriptions.find(s => s.user === user && s.agent === agent && s.cancelledAt === null)

/** The invoice worker's job, as the queue runs it, dated `when`. */
const invoiceRun = (when: Date) => invoiceProcessor(ctx.deps)({ data: { at: when.toISOString() } } as Job)

const proxyCall = (agent: TestAgent, user: TestUser) =>
  ctx.call('POST', '/v1/agent/proxy-call', { apiKey: agent.apiKey, body: { userId: user.id, provider: 'acme', method: 'GET', path: '/echo' } })

/** Proxy calls of the agent for the user, each answered with the period's usage so far. */
async function calls(world: World, random: Random, user: number, agent: number) {
  const s = active(world, user, agent)
  for (let n = 1 + random.int(random.chance(0.2) ? 8 : 3); n > 0; n--) {
    const res = await proxyCall(world.agents[agent]!, world.users[user]!)
    if (!s) return void expectError(res, 403, 'not_subscribed')
    expect(res.status).toBe(200)
    s.calls.push(now())
    const k = periodIndexOf(s.start, now())
    const inPeriod = s.calls.filter(c => periodIndexOf(s.start, c) === k).length
    const included = termsOf(world.plans[agent]!, s.start, k).included
    expect(res.body.data.usage).toEqual({ periodCalls: inPeriod, includedProxyCalls: included, overageCalls: Math.max(0, inPeriod - included) })
    tick()
  }
}

async function purchase(world: World, random: Random, user: number) {
  const config = random.pick(world.configs)
  const res = await ctx.call('POST', `/v1/billing/configs/${config.id}/purchase`, { token: world.users[user]!.token })
  const bought = world.purchases.find(p => p.user === user && p.configId === config.id)
  // Buying again charges nothing: the same purchase, at what was paid.
  if (bought) {
    count('bought again')
    return void expect([res.status, res.body.data.priceCents]).toEqual([200, bought.price])
  }
  if (world.inactive.has(config.id)) return void expectError(res, 409, 'config_inactive')
  expect([res.status, res.body.data.priceCents]).toEqual([201, config.price])
  world.purchases.push({ user, agent: config.agent, configId: config.id, price: config.price, at: now() })
}

/** What the sequences did, over all seeds: checked at the end, so a change of the steps cannot quietly stop testing a case. */
const tally: Record<string, number> = {}
const count = (what: string, n = 1) => void (tally[what] = (tally[what] ?? 0) + n)

/** One random step of a sequence, the clock already moved. */
async function step(world: World, random: Random) {
  const user = random.int(world.users.length)
  const agent = random.int(world.agents.length)
  const u = world.users[user]!
  const choice = random.int(100)
  if (choice < 25) {
    const res = await ctx.call('POST', '/v1/billing/subscriptions', { token: u.token, body: { planId: world.planIds[agent] } })
    if (world.inactive.has(world.planIds[agent]!)) return void expectError(res, 409, 'plan_inactive')
    if (active(world, user, agent)) return void expectError(res, 409, 'already_subscribed')
    expect(res.status).toBe(201)
    count(world.subscriptions.some(s => s.user === user && s.agent === agent) ? 'resubscribed' : 'subscribed')
    world.subscriptions.push({ id: res.body.data.id, user, agent, start: now(), cancelledAt: null, calls: [] })
  } else if (choice < 35) {
    const s = active(world, user, agent)
    if (!s) return
    await ok(ctx.call('DELETE', `/v1/billing/subscriptions/${s.id}`, { token: u.token }))
    s.cancelledAt = now()
    count('cancelled')
  } else if (choice < 45) {
    const terms = randomTerms(random)
    await ok(ctx.call('PATCH', `/v1/billing/plans/${world.planIds[agent]}`, { token: world.owner.token, body: termsBody(terms) }))
    const last = world.plans[agent]!.versions.at(-1)!.terms
    count(terms.monthly > last.monthly ? 'price rise' : terms.monthly < last.monthly ? 'price drop' : 'price kept')
    world.plans[agent]!.versions.push({ from: now(), terms })
  } else if (choice < 75) {
    await calls(world, random, user, agent)
  } else if (choice < 85) {
    await purchase(world, random, user)
  } else if (choice < 88) {
    const config = random.pick(world.configs)
    config.price = random.pick([0, 3, 10_000_000])
    await ok(ctx.call('PATCH', `/v1/billing/configs/${config.id}`, { token: world.owner.token, body: { priceCents: config.price } }))
  } else if (choice === 88) {
    // Off sale: no new subscriptions, the existing ones go on.
    await ok(ctx.call('DELETE', `/v1/billing/plans/${world.planIds[agent]}`, { token: world.owner.token }))
    world.inactive.add(world.planIds[agent]!)
    count('plan off sale')
  } else if (choice === 89) {
    const config = random.pick(world.configs)
    await ok(ctx.call('DELETE', `/v1/billing/configs/${config.id}`, { token: world.owner.token }))
    world.inactive.add(config.id)
    count('config off sale')
  } else {
    // The scheduled run: once, repeated, or two at once.
    const mode = random.int(3)
    const when = now()
    if (mode === 2) await Promise.all([invoiceRun(when), invoiceRun(when)])
    else await invoiceRun(when)
    if (mode === 1) await invoiceRun(when)
    count(['run', 'run repeated', 'runs at once'][mode]!)
    if (world.runs.length > 0 && when.getTime() - world.runs.at(-1)!.getTime() > 62 * dayMs) count('months without a run')
    world.runs.push(when)
  }
}

/** Every invoice of a user, through the API, paged with `before` as a client pages. */
async function allInvoices(user: TestUser, limit: number) {
  const seen: any[] = []
  let before = ''
  for (let page = 0; page < 10_000; page++) {
    const rows = await ok(ctx.call('GET', `/v1/billing/invoices?limit=${limit}${before}`, { token: user.token }))
    seen.push(...rows)
    if (rows.length < limit) return seen
    before = `&before=${encodeURIComponent(rows.at(-1).issuedAt)}`
  }
  throw new Error('paging did not end')
}

/**
 * The user's invoices through the API against the model's. A payer's invoices each have a time of
 * their own (a page ends at a time): those issued together are dated a millisecond apart, from the
 * run's (or the purchase's) time.
 */
function compareInvoices(got: any[], want: (ModelInvoice & { participantId: string })[]) {
  const shape = (i: any) => ({
    participantId: i.participantId,
    subscriptionId: i.subscriptionId,
    periodStart: i.periodStart,
    periodEnd: i.periodEnd,
    lines: i.lines.map((l: Line) => ({ kind: l.kind, quantity: l.quantity, unitPriceCents: l.unitPriceCents, amountCents: l.amountCents })),
    totalCents: i.totalCents,
  })
  const key = (i: any) => `${i.participantId}${i.subscriptionId}${i.periodStart}${i.totalCents}${i.issuedAt}`
  const sorted = <T>(items: T[]) => [...items].sort((a, b) => key(a).localeCompare(key(b)))
  const gotSorted = sorted(got)
  const wantSorted = sorted(want)
  expect(gotSorted.map(shape)).toEqual(wantSorted.map(shape))
  const together = (i: ModelInvoice) => want.filter(w => w.issuedAt === i.issuedAt).length
  for (const [n, invoice] of gotSorted.entries()) {
    const lag = Date.parse(invoice.issuedAt) - Date.parse(wantSorted[n]!.issuedAt)
    expect({ lag, within: lag >= 0 && lag < together(wantSorted[n]!) }).toEqual({ lag, within: true })
    expect(typeof invoice.totalCents).toBe('number')
    expect(invoice.status).toBe('issued')
  }
  expect(new Set(got.map(i => i.issuedAt)).size).toBe(got.length)
  // Newest first, by time and by number alike.
  expect(got.map(i => i.number)).toEqual([...got.map(i => i.number)].sort((a, b) => b - a))
}

const monthOf = (when: Date) => ({
  start: new Date(Date.UTC(when.getUTCFullYear(), when.getUTCMonth(), 1)),
  end: new Date(Date.UTC(when.getUTCFullYear(), when.getUTCMonth() + 1, 1)),
})

/** Waits for the metering worker to have counted every call of the world. */
async function metered(world: World) {
  const total = world.subscriptions.reduce((n, s) => n + s.calls.length, 0)
  const ids = world.subscriptions.map(s => s.id)
  for (let i = 0; i < 600; i++) {
    const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from usage_events where subscription_id = any(${ids}::uuid[])`
    if (row!.n === total) return
    await Bun.sleep(25)
  }
}

/** What each user sees: invoices, subscriptions with their current period and its calls. */
async function compareUsers(world: World, expected: ModelInvoice[]) {
  const numbers: number[] = []
  for (const [u, user] of world.users.entries()) {
    const got = await allInvoices(user, 7)
    numbers.push(...got.map(i => i.number))
    compareInvoices(
      got,
      expected.filter(i => i.user === u).map(i => ({ ...i, participantId: world.agents[i.agent]!.id })),
    )
    const bought = await ok(ctx.call('GET', '/v1/billing/my-configs', { token: user.token }))
    const byConfig = (a: { configId: string }, b: { configId: string }) => a.configId.localeCompare(b.configId)
    expect(bought.map((p: any) => ({ configId: p.configId, priceCents: p.priceCents, purchasedAt: p.purchasedAt })).sort(byConfig)).toEqual(
      world.purchases
        .filter(p => p.user === u)
        .map(p => ({ configId: p.configId, priceCents: p.price, purchasedAt: p.at.toISOString() }))
        .sort(byConfig),
    )
    const listed = await ok(ctx.call('GET', '/v1/billing/subscriptions?limit=100', { token: user.token }))
    const mine = world.subscriptions.filter(s => s.user === u)
    expect(listed.length).toBe(mine.length)
    for (const s of mine) {
      const k = periodIndexOf(s.start, s.cancelledAt ?? now())
      expect(listed.find((r: any) => r.id === s.id)).toMatchObject({
        status: s.cancelledAt ? 'cancelled' : 'active',
        currentPeriodStart: periodStart(s.start, k).toISOString(),
        currentPeriodEnd: periodStart(s.start, k + 1).toISOString(),
        usage: {
          proxyCalls: s.calls.filter(c => periodIndexOf(s.start, c) === k).length,
          includedProxyCalls: termsOf(world.plans[s.agent]!, s.start, k).included,
        },
      })
    }
  }
  // Unique numbers (the gaps are other tests' invoices, in this shared database).
  expect(new Set(numbers).size).toBe(numbers.length)
}

/** What the owner sees in creator stats, and each agent in its status. */
async function compareOwner(world: World, expected: ModelInvoice[]) {
  const stats = await ok(ctx.call('GET', '/v1/billing/creator-stats', { token: world.owner.token }))
  const month = monthOf(now())
  const sum = (items: ModelInvoice[]) => items.reduce((n, i) => n + i.totalCents, 0)
  const inMonth = (iso: string) => iso >= month.start.toISOString() && iso < month.end.toISOString()
  for (const [a, agent] of world.agents.entries()) {
    const theirs = expected.filter(i => i.agent === a)
    const sales = theirs.filter(i => i.subscriptionId === null)
    const subscribers = world.subscriptions.filter(s => s.agent === a)
    const row = stats.agents.find((r: any) => r.participantId === agent.id)
    expect(row).toMatchObject({
      activeSubscribers: subscribers.filter(s => !s.cancelledAt).length,
      revenueCents: sum(theirs),
      revenueThisMonthCents: sum(theirs.filter(i => inMonth(i.issuedAt))),
      configSales: sales.length,
      configRevenueCents: sum(sales),
      proxyCallsThisMonth: subscribers.flatMap(s => s.calls).filter(c => c >= month.start && c < month.end).length,
    })
    const status = await ok(ctx.call('GET', '/v1/agent/status', { apiKey: agent.apiKey }))
    expect(status).toMatchObject({ balanceCents: sum(theirs), activeSubscribers: row.activeSubscribers })
  }
  expect(stats.totals).toEqual({
    revenueCents: sum(expected),
    activeSubscribers: world.subscriptions.filter(s => !s.cancelledAt).length,
    configSales: expected.filter(i => i.subscriptionId === null).length,
  })
}

// Month ends, leap days and the turn of a year; all well before the real clock (a run dated ahead
// of the database's clock is refused).
const starts = [
  '2011-12-31T23:30:00.000Z',
  '2012-01-31T10:00:00.000Z',
  '2012-02-29T12:00:00.000Z',
  '2015-01-30T00:00:00.000Z',
  '2015-11-30T18:45:00.000Z',
  '2016-01-31T23:59:59.999Z',
  '2016-02-28T06:00:00.000Z',
  '2019-03-31T00:00:00.000Z',
]

describe('billing against the model of the contract', () => {
  for (const seed of [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) {
    test(`seeded sequence ${seed}`, async () => {
      const random = seeded(seed * 7919)
      at(new Date(random.pick(starts)))
      try {
        const world = await createWorld(random, 2, 3)
        const stop = Date.now() - 100 * dayMs
        for (let i = 0; i < 60 && now().getTime() < stop; i++) {
          // milliseconds to months between steps: many steps in a period, or months without a run
          tick(random.pick([1, 60_000, 3_600_000, dayMs, 9 * dayMs, 29 * dayMs, 31 * dayMs, 95 * dayMs]) + random.int(1000))
          await step(world, random)
        }
        tick(40 * dayMs)
        await invoiceRun(now())
        world.runs.push(now())
        await metered(world)
        const expected = expectedInvoices(world.plans, world.subscriptions, world.purchases, world.runs, now())
        expect(expected.length).toBeGreaterThan(0)
        await compareUsers(world, expected)
        await compareOwner(world, expected)
        count(
          'calls',
          world.subscriptions.reduce((n, s) => n + s.calls.length, 0),
        )
        count('purchases', world.purchases.length)
        count('invoices', expected.length)
        count('overage lines', expected.filter(i => i.lines.some(l => l.kind === 'overage')).length)
        count(
          'periods clamped',
          expected.filter(
            i => i.periodStart && new Date(i.periodStart).getUTCDate() < world.subscriptions.find(s => s.id === i.subscriptionId)!.start.getUTCDate(),
          ).length,
        )
        count('periods across a year end', expected.filter(i => i.periodStart?.slice(5, 7) === '12' && i.periodEnd?.slice(5, 7) === '01').length)
      } finally {
        ctx.clock.set(new Date())
      }
    }, 60_000)
  }

  test('the sequences covered every case', () => {
    console.log('billing-ledger sequences:', JSON.stringify(tally))
    for (const what of [
      'subscribed',
      'resubscribed',
      'cancelled',
      'price rise',
      'price drop',
      'plan off sale',
      'config off sale',
      'run',
      'run repeated',
      'runs at once',
      'months without a run',
      'bought again',
      'calls',
      'purchases',
      'overage lines',
      'periods clamped',
      'periods across a year end',
    ]) {
      expect({ what, seen: (tally[what] ?? 0) > 0 }).toEqual({ what, seen: true })
    }
  })
})

describe('the edges of periods', () => {
  test('a leap February, the last millisecond of a period and the first of the next, a cancellation as a period begins', async () => {
    at(new Date('2019-12-31T23:59:59.999Z'))
    try {
      const owner = await signUp(ctx)
      const world = emptyWorld(owner)
      const terms: Terms = { monthly: 1000, included: 1, overage: 3 }
      const agent = await createAgent(ctx, owner)
      world.agents.push(agent)
      world.planIds.push((await createPlan(owner, agent, terms)).id)
      world.plans.push({ versions: [{ from: now(), terms }] })
      world.users.push(await connectedUser(), await connectedUser())
      const subscribe = async (user: number, when: string) => {
        at(new Date(when))
        const s = await ok(
          ctx.call('POST', '/v1/billing/subscriptions', { token: world.users[user]!.token, body: { planId: world.planIds[0] } }),
          201,
        )
        world.subscriptions.push({ id: s.id, user, agent: 0, start: now(), cancelledAt: null, calls: [] })
        return world.subscriptions.at(-1)!
      }
      const call = async (s: ModelSubscription, when: string) => {
        at(new Date(when))
        expect((await proxyCall(agent, world.users[s.user]!)).status).toBe(200)
        s.calls.push(now())
      }
      // From the year's last millisecond: periods to Jan 31, Feb 29 (2020 is a leap year), Mar 31.
      const late = await subscribe(0, '2019-12-31T23:59:59.999Z')
      // From Jan 31: to Feb 29, then Mar 31 (anchored on the 31st, not on the 29th).
      const leap = await subscribe(1, '2020-01-31T10:00:00.000Z')
      expect(periodStart(leap.start, 1).toISOString()).toBe('2020-02-29T10:00:00.000Z')
      expect(periodStart(leap.start, 2).toISOString()).toBe('2020-03-31T10:00:00.000Z')
      expect(periodStart(late.start, 2).toISOString()).toBe('2020-02-29T23:59:59.999Z')
      await call(leap, '2020-02-29T09:59:59.998Z')
      await call(leap, '2020-02-29T09:59:59.999Z') // the first period's last millisecond: its overage
      await call(leap, '2020-02-29T10:00:00.000Z') // the second's first
      await call(late, '2020-02-29T23:59:59.998Z')
      await call(late, '2020-02-29T23:59:59.999Z')
      // Cancelled at the very instant its third period begins: that period is the one it was cancelled in.
      at(new Date('2020-03-31T10:00:00.000Z'))
      await ok(ctx.call('DELETE', `/v1/billing/subscriptions/${leap.id}`, { token: world.users[1]!.token }))
      leap.cancelledAt = now()
      // A run a minute less a millisecond after the second period's end issues the first, a minute after the second.
      for (const when of ['2020-03-31T10:00:59.999Z', '2020-03-31T10:01:00.000Z', '2020-04-30T23:59:59.998Z']) {
        at(new Date(when))
        await invoiceRun(now())
        world.runs.push(now())
      }
      await metered(world)
      const expected = expectedInvoices(world.plans, world.subscriptions, world.purchases, world.runs, now())
      expect(expected.filter(i => i.subscriptionId === leap.id).map(i => [i.periodStart, i.totalCents, i.issuedAt])).toEqual([
        ['2020-01-31T10:00:00.000Z', 1003, '2020-03-31T10:00:59.999Z'],
        ['2020-02-29T10:00:00.000Z', 1000, '2020-03-31T10:01:00.000Z'],
        ['2020-03-31T10:00:00.000Z', 1000, '2020-04-30T23:59:59.998Z'],
      ])
      await compareUsers(world, expected)
      await compareOwner(world, expected)
    } finally {
      ctx.clock.set(new Date())
    }
  })
})

describe('the extremes of the numbers', () => {
  test('prices, periods and calls at their largest: sums past 2^31 cents, as JSON numbers, on every page', async () => {
    const start = new Date('2014-01-31T12:00:00.000Z')
    at(start)
    try {
      const owner = await signUp(ctx)
      const world = emptyWorld(owner)
      const most: Terms = { monthly: 10_000_000, included: 0, overage: 100_000 }
      const none: Terms = { monthly: 0, included: 0, overage: 0 }
      for (const terms of [most, none]) {
        const agent = await createAgent(ctx, owner)
        world.agents.push(agent)
        world.planIds.push((await createPlan(owner, agent, terms)).id)
        world.plans.push({ versions: [{ from: now(), terms }] })
        for (const price of [10_000_000, 0])
          world.configs.push({ id: (await createConfig(owner, agent, price)).id, agent: world.agents.length - 1, price })
      }
      world.users.push(await connectedUser())
      tick()
      for (const agent of [0, 1]) {
        const s = await ok(
          ctx.call('POST', '/v1/billing/subscriptions', { token: world.users[0]!.token, body: { planId: world.planIds[agent] } }),
          201,
        )
        world.subscriptions.push({ id: s.id, user: 0, agent, start: now(), cancelledAt: null, calls: [] })
        tick()
        for (let n = 0; n < 3; n++) {
          expect((await proxyCall(world.agents[agent]!, world.users[0]!)).status).toBe(200)
          world.subscriptions[agent]!.calls.push(now())
          tick()
        }
      }
      // 25,000 more calls in the first period of the dearest plan, recorded as a proxy call records
      // its call before answering (sql/00019); the invoice run counts them.
      const dear = world.subscriptions[0]!
      const first = now().getTime()
      await ctx.deps.sql`
        insert into usage_uncounted (id, subscription_id, period_index, occurred_at)
        select gen_random_uuid(), ${dear.id}, 0, ${new Date(first)}::timestamptz + i * interval '10 milliseconds'
        from generate_series(0, 24999) i
      `
      for (let i = 0; i < 25_000; i++) dear.calls.push(new Date(first + i * 10))
      for (const config of world.configs) {
        tick()
        await purchase(world, { pick: () => config } as unknown as Random, 0)
      }
      // Nearly eleven years without a run: one run issues every period, all dated alike.
      at(new Date('2024-12-31T12:05:00.000Z'))
      await invoiceRun(now())
      world.runs.push(now())
      const expected = expectedInvoices(world.plans, world.subscriptions, world.purchases, world.runs, now())
      expect(expected.length).toBe(2 * 131 + 4)
      const firstPeriod = expected.find(i => i.subscriptionId === dear.id && i.periodStart === dear.start.toISOString())!
      expect(firstPeriod.totalCents).toBe(10_000_000 + 25_003 * 100_000)
      expect(firstPeriod.totalCents).toBeGreaterThan(2 ** 31)

      // Every invoice on the pages of the largest size too, none twice.
      const pages = await allInvoices(world.users[0]!, 100)
      expect(pages.length).toBe(expected.length)
      expect(new Set(pages.map(i => i.id)).size).toBe(expected.length)
      const raw = await ctx.call('GET', '/v1/billing/invoices?limit=100', { token: world.users[0]!.token })
      expect(raw.status).toBe(200)
      await compareUsers(world, expected)
      await compareOwner(world, expected)
      const stats = await ok(ctx.call('GET', '/v1/billing/creator-stats', { token: owner.token }))
      expect(stats.totals.revenueCents).toBe(expected.reduce((n, i) => n + i.totalCents, 0))
      expect(typeof stats.totals.revenueCents).toBe('number')
      expect(stats.totals.revenueCents).toBeGreaterThan(2 ** 31)
    } finally {
      ctx.clock.set(new Date())
    }
  }, 60_000)

  test('prices beyond the contract’s ranges are 400 validation_failed, never a 500', async () => {
    const owner = await signUp(ctx)
    const agent = await createAgent(ctx, owner)
    const plan = await createPlan(owner, agent, { monthly: 1, included: 0, overage: 0 })
    const config = await createConfig(owner, agent, 1)
    const wrong = [-1, 1.5, '100', 2 ** 31, 2 ** 53 + 2, 1e300, null]
    const cases: [string, string, Record<string, unknown>, string, number][] = [
      [
        'POST',
        '/v1/billing/plans',
        { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 0, overagePerCallCents: 0 },
        'monthlyPriceCents',
        10_000_001,
      ],
      [
        'POST',
        '/v1/billing/plans',
        { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 0, overagePerCallCents: 0 },
        'includedProxyCalls',
        10_000_001,
      ],
      [
        'POST',
        '/v1/billing/plans',
        { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 0, overagePerCallCents: 0 },
        'overagePerCallCents',
        100_001,
      ],
      ['PATCH', `/v1/billing/plans/${plan.id}`, {}, 'monthlyPriceCents', 10_000_001],
      ['PATCH', `/v1/billing/plans/${plan.id}`, {}, 'overagePerCallCents', 100_001],
      [
        'POST',
        '/v1/billing/configs',
        { participantId: agent.id, name: 'C', priceCents: 1, fileType: 'yaml', content: 'x' },
        'priceCents',
        10_000_001,
      ],
      ['PATCH', `/v1/billing/configs/${config.id}`, {}, 'priceCents', 10_000_001],
    ]
    for (const [method, path, base, field, over] of cases) {
      for (const value of [...wrong, over]) {
        const res = await ctx.call(method, path, { token: owner.token, body: { ...base, [field]: value } })
        expect({ field, value, details: expectError(res, 400, 'validation_failed').details[0].path }).toEqual({ field, value, details: `/${field}` })
      }
    }
    expect((await ok(ctx.call('GET', `/v1/billing/plans/${agent.id}`, { token: owner.token })))[0]).toMatchObject({
      monthlyPriceCents: 1,
      overagePerCallCents: 0,
    })
  })
})
