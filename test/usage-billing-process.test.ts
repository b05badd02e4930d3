/**
 * Issue 6 with real worker processes: a worker killed (SIGKILL) while it meters or invoices, then
 * restarted, loses no call and issues no duplicate; and `invoices:run` as a command.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import type { Queue } from 'bullmq'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createAgent, createTestContext, redisUrl, signUp, testJwtSecret, type TestContext } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { ensurePeriods } from '../src/billing/subscriptions/store.ts'
import { exitWithin, processGroup, type Started } from './helpers/processes.ts'

const root = mkdtempSync(join(tmpdir(), 'am-usage-billing-process-'))
const connectionsKey = randomBytes(32).toString('hex')
const { start, killAll } = processGroup()
const contexts: TestContext[] = []

// A safety net: every test also cleans up after itself in `finally`.
afterAll(async () => {
  await killAll()
  await Promise.all(contexts.splice(0).map(ctx => ctx.close().catch(() => {})))
  rmSync(root, { recursive: true, force: true })
})

async function context(env: Record<string, string> = {}): Promise<TestContext> {
  const ctx = await createTestContext({ env: { CONNECTIONS_KEY: connectionsKey, ...env } })
  contexts.push(ctx)
  return ctx
}

async function closeContext(ctx: TestContext) {
  const index = contexts.indexOf(ctx)
  if (index >= 0) contexts.splice(index, 1)
  await ctx.close()
}

/** A deployment's environment from scratch, sharing the context's database and Redis prefix (so its queues). */
function environment(ctx: TestContext): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? root,
    DATABASE_URL: ctx.database.url,
    REDIS_URL: redisUrl,
    REDIS_PREFIX: ctx.config.redisPrefix,
    AUTH_JWT_SECRET: testJwtSecret,
    CONNECTIONS_KEY: connectionsKey,
    QUEUE_LOCK_MS: '2000',
    LOG_LEVEL: 'warn',
    DATA_DIR: mkdtempSync(join(root, 'data-')),
  }
}

/** Kills a process still running (a test that failed midway) and waits for it to be gone. */
async function stop(started: Started | undefined) {
  if (!started) return
  if (started.proc.exitCode === null && started.proc.signalCode === null) started.proc.kill('SIGKILL')
  await started.proc.exited
}

/** Waits until a worker process consumes every one of the queues (BullMQ names its connections). */
async function waitForWorker(started: Started, queues: Queue[], ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms
  for (;;) {
    if (started.proc.exitCode !== null) throw new Error(`worker exited with ${started.proc.exitCode}: ${await started.stderr}`)
    const counts = await Promise.all(queues.map(queue => queue.getWorkersCount()))
    if (counts.every(count => count > 0)) return
    if (Date.now() > deadline) throw new Error(`no worker on ${queues.map(q => q.name).join(', ')} within ${ms} ms`)
    await Bun.sleep(50)
  }
}

/** Polls `read` until `done` says so, or fails after `ms` with the last value. */
async function until<T>(read: () => Promise<T>, done: (value: T) => boolean, ms: number, what: string): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await read()
    if (done(value)) return value
    if (Date.now() > deadline) throw new Error(`${what}: still ${JSON.stringify(value)} after ${ms} ms`)
    await Bun.sleep(20)
  }
}

async function int(query: Promise<{ n: number }[]>): Promise<number> {
  const [row] = await query
  return row!.n
}

/**
 * `count` subscribers of a few agents (one owner), started three months and a day before `at`, so each
 * has three ended periods; a price change midway; calls over the included ones in some periods. Set-based.
 */
async function seedEndedPeriods(ctx: TestContext, count: number, at: Date): Promise<number> {
  const { sql } = ctx.deps
  const tag = randomBytes(4).toString('hex')
  await sql.begin(async tx => {
    const [owner] = await tx<{ id: string }[]>`
      insert into users (provider_id, email) values (${`owner-${tag}`}, ${`owner-${tag}@example.com`}) returning id
    `
    await tx`
      insert into participants (owner_id, name, display_name)
      select ${owner!.id}, ${`bulk-${tag}-`} || a, 'Bulk agent ' || a from generate_series(1, 10) a
    `
    await tx`
      insert into plans (participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
      select id, 'Bulk ' || name, 1000, 3, 10, ${at}::timestamptz - interval '1 year', ${at}::timestamptz - interval '1 year'
      from participants where owner_id = ${owner!.id}
    `
    // The terms history: the original price, and a rise ten weeks before `at` for half of the plans, in
    // the subscribers' first period, so that it is billed from their third (a rise waits a whole period).
    await tx`
      insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
      select p.id, p.created_at, 1000, 3, 10 from plans p join participants a on a.id = p.participant_id
      where a.owner_id = ${owner!.id}
      union all
      select p.id, ${at}::timestamptz - interval '10 weeks', 1500, 5, 7 from plans p join participants a on a.id = p.participant_id
      where a.owner_id = ${owner!.id} and right(a.name, 1) in ('1', '3', '5', '7', '9')
    `
    await tx`
      insert into users (provider_id, email)
      select ${`bulk-${tag}-`} || i, null from generate_series(1, ${count}) i
    `
    await tx`
      with agents as (
        select p.id as plan_id, p.participant_id, row_number() over (order by p.id) - 1 as k
        from plans p join participants a on a.id = p.participant_id where a.owner_id = ${owner!.id}
      ),
      subscribers as (
        select id as user_id, row_number() over (order by id) as i from users where provider_id like ${`bulk-${tag}-%`}
      )
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select s.user_id, a.participant_id, a.plan_id, 'active',
        ${at}::timestamptz - interval '3 months' - interval '1 day', ${at}::timestamptz - interval '3 months' - interval '1 day'
      from subscribers s join agents a on a.k = s.i % 10
    `
  })
  // The period rows (three ended, one current per subscription), then some usage in the ended ones.
  await ensurePeriods(sql, at)
  await sql`
    update subscription_periods set proxy_calls = abs(hashtext(subscription_id::text || period_index)) % 9
    where period_end <= ${at}
  `
  return int(sql`select count(*)::int as n from subscription_periods where period_end <= ${at} and invoice_id is null`)
}

/** Every invariant of invoicing the ended periods as of `at`, once each. */
async function expectInvoicedOnce(ctx: TestContext, at: Date, expected: number) {
  const { sql } = ctx.deps
  expect([...(await sql`select subscription_id, period_index from invoices group by 1, 2 having count(*) > 1`)]).toEqual([])
  const [numbers] = await sql<{ n: number; distinct: number; min: number; max: number }[]>`
    select count(*)::int as n, count(distinct number)::int as distinct, min(number)::int as min, max(number)::int as max
    from invoices
  `
  expect(numbers).toEqual({ n: expected, distinct: expected, min: 1, max: expected })
  expect(await int(sql`select next_number::int as n from invoice_counter`)).toBe(expected + 1)
  // Every ended period points at its own invoice; no period still running has one.
  expect(await int(sql`select count(*)::int as n from subscription_periods where period_end <= ${at} and invoice_id is null`)).toBe(0)
  expect(await int(sql`select count(*)::int as n from subscription_periods where period_end > ${at} and invoice_id is not null`)).toBe(0)
  const matched = sql<{ n: number }[]>`
    select count(*)::int as n from subscription_periods sp
    join invoices i on i.id = sp.invoice_id
    where i.subscription_id = sp.subscription_id and i.period_index = sp.period_index
      and i.period_start = sp.period_start and i.period_end = sp.period_end
  `
  expect(await int(matched)).toBe(expected)
  // Totals: the lines add up, and they are the period's terms with its overage.
  const unbalanced = sql<{ n: number }[]>`
    select count(*)::int as n from invoices i
    where i.total_cents <> (select coalesce(sum(amount_cents), 0) from invoice_lines l where l.invoice_id = i.id)
  `
  expect(await int(unbalanced)).toBe(0)
  const mispriced = sql<{ n: number }[]>`
    select count(*)::int as n from invoices i join subscription_periods sp on sp.invoice_id = i.id
    where i.total_cents <> sp.monthly_price_cents + greatest(0, sp.proxy_calls - sp.included_proxy_calls) * sp.overage_per_call_cents
  `
  expect(await int(mispriced)).toBe(0)
}

describe('usage billing with real worker processes', () => {
  test('a worker killed with SIGKILL while metering, then restarted, loses no call and counts none twice', async () => {
    const ctx = await context({ PROXY_ALLOWED_HOSTS: '127.0.0.1' })
    const upstream: Upstream = startUpstream()
    let first: Started | undefined
    let second: Started | undefined
    try {
      const owner = await signUp(ctx)
      const agent = await createAgent(ctx, owner)
      const plan = await ctx.call('POST', '/v1/billing/plans', {
        token: owner.token,
        body: { participantId: agent.id, name: 'Metered', monthlyPriceCents: 1000, includedProxyCalls: 1000, overagePerCallCents: 1 },
      })
      expect(plan.status).toBe(201)
      const user = await signUp(ctx)
      const subscription = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
      expect(subscription.status).toBe(201)
      const subscriptionId: string = subscription.body.data.id
      const connection = await ctx.call('POST', '/v1/connections', {
        token: user.token,
        body: { provider: 'acme', baseUrl: `${upstream.url}/api`, credential: 'upstream-secret-token' },
      })
      expect(connection.status).toBe(201)

      const counted = () =>
        int(ctx.deps.sql`select coalesce(sum(proxy_calls), 0)::int as n from subscription_periods where subscription_id = ${subscriptionId}`)
      const proxy = () =>
        ctx.call('POST', '/v1/agent/proxy-call', {
          apiKey: agent.apiKey,
          body: { userId: user.id, provider: 'acme', method: 'GET', path: '/echo' },
        })

      const env = environment(ctx)
      first = start(['src/main.ts', '--workers'], env)
      await waitForWorker(first, [ctx.deps.queues.metering])

      // 300 calls, 25 at a time, while the worker counts them; the worker dies once it has counted some.
      const total = 300
      const batch = 25
      const statuses: number[] = []
      const load = (async () => {
        for (let fired = 0; fired < total; fired += batch) {
          const results = await Promise.all(Array.from({ length: batch }, proxy))
          statuses.push(...results.map(result => result.status))
        }
      })()
      // Killed once it has counted some while more wait behind the ones it holds.
      const backlog = async () => ({
        counted: await counted(),
        waiting: await ctx.deps.queues.metering.getWaitingCount(),
      })
      await until(backlog, b => b.counted >= 40 && b.waiting > 0, 20_000, 'calls counted by the first worker')
      first.proc.kill('SIGKILL')
      await exitWithin(first.proc, 5_000)
      expect(first.proc.signalCode).toBe('SIGKILL')
      // A transaction whose commit was already on the wire may land just after the kill.
      await Bun.sleep(200)
      const countedAtKill = await counted()
      expect(countedAtKill).toBeGreaterThan(0)
      expect(countedAtKill).toBeLessThan(total)

      await load
      expect(statuses).toEqual(Array.from({ length: total }, () => 200))
      // With no worker running nothing more is counted: the queue holds the rest.
      expect(await counted()).toBe(countedAtKill)
      const pending = await ctx.deps.queues.metering.getJobCounts('active', 'waiting', 'delayed', 'prioritized')
      // The dead worker held jobs (still `active` until their lock expires): the kill interrupted them.
      expect(pending.active).toBeGreaterThan(0)
      expect(pending.active! + pending.waiting! + pending.delayed! + pending.prioritized!).toBeGreaterThanOrEqual(total - countedAtKill)

      second = start(['src/main.ts', '--workers'], env)
      await waitForWorker(second, [ctx.deps.queues.metering])
      expect(await until(counted, n => n >= total, 30_000, 'calls counted after the restart')).toBe(total)
      // Jobs the dead worker held come back after the lock expires; once all are done, still exactly `total`.
      await until(
        () => ctx.deps.queues.metering.getJobCounts('active', 'waiting', 'delayed', 'prioritized'),
        c => c.active! + c.waiting! + c.delayed! + c.prioritized! === 0,
        15_000,
        'metering queue drained',
      )
      expect(await ctx.deps.queues.metering.getFailedCount()).toBe(0)
      expect(await counted()).toBe(total)
      const [events] = await ctx.deps.sql<{ n: number; ids: number }[]>`
        select count(*)::int as n, count(distinct id)::int as ids from usage_events where subscription_id = ${subscriptionId}
      `
      expect(events).toEqual({ n: total, ids: total })
      expect(upstream.received.length).toBe(total)

      second.proc.kill('SIGTERM')
      expect(await exitWithin(second.proc, 15_000)).toBe(0)
    } finally {
      await stop(first)
      await stop(second)
      upstream.stop()
      await closeContext(ctx)
    }
  }, 60_000)

  test('a worker killed with SIGKILL while issuing invoices, then restarted, issues each once with gap-free numbers', async () => {
    const ctx = await context()
    let first: Started | undefined
    let second: Started | undefined
    try {
      const at = new Date()
      const expected = await seedEndedPeriods(ctx, 20_000, at)
      expect(expected).toBe(60_000)
      const { invoices } = ctx.deps.queues
      const issued = () => int(ctx.deps.sql`select count(*)::int as n from invoices`)

      // A worker also starts its scheduled run (at: now) when it boots; no period ends between `at`
      // and now, so every run sees the same ended periods, whichever of them the kill interrupts.
      await invoices.add('invoice-run', { at: at.toISOString() }, { jobId: 'run-before-kill' })
      const env = environment(ctx)
      first = start(['src/main.ts', '--workers'], env)
      await until(issued, n => n > 0, 30_000, 'invoices issued by the first worker')
      first.proc.kill('SIGKILL')
      await exitWithin(first.proc, 5_000)
      expect(first.proc.signalCode).toBe('SIGKILL')
      await Bun.sleep(200)
      const issuedAtKill = await issued()
      expect(issuedAtKill).toBeGreaterThan(0)
      expect(issuedAtKill).toBeLessThan(expected)
      // What was committed before the kill is whole: numbers 1..k, each with its lines.
      const [partial] = await ctx.deps.sql<{ max: number; lineless: number }[]>`
        select max(number)::int as max,
          (select count(*)::int from invoices i where not exists (select 1 from invoice_lines l where l.invoice_id = i.id)) as lineless
        from invoices
      `
      expect(partial).toEqual({ max: issuedAtKill, lineless: 0 })

      second = start(['src/main.ts', '--workers'], env)
      await waitForWorker(second, [invoices])
      await invoices.add('invoice-run', { at: at.toISOString() }, { jobId: 'run-after-restart' })
      expect(await until(issued, n => n >= expected, 45_000, 'invoices issued after the restart')).toBe(expected)
      // The interrupted run comes back once its lock expires; let every run finish before checking.
      await until(
        () => invoices.getJobCounts('active', 'waiting', 'prioritized'),
        c => c.active! + c.waiting! + c.prioritized! === 0,
        20_000,
        'invoice runs finished',
      )
      expect(await invoices.getFailedCount()).toBe(0)
      await expectInvoicedOnce(ctx, at, expected)
      const [variety] = await ctx.deps.sql<{ prices: number[]; overage: number }[]>`
        select (select array_agg(distinct l.unit_price_cents::int order by l.unit_price_cents::int) from invoice_lines l where kind = 'subscription') as prices,
          (select count(*)::int from invoice_lines where kind = 'overage') as overage
      `
      expect(variety!.prices).toEqual([1000, 1500])
      expect(variety!.overage).toBeGreaterThan(0)
      // The interrupted attempt's work that committed plus what completed runs report is everything, once.
      const completed = await invoices.getJobs(['completed'])
      const reported = completed.reduce((sum, job) => sum + ((job?.returnvalue as { issued?: number } | undefined)?.issued ?? 0), 0)
      expect(reported).toBe(expected - issuedAtKill)
      expect((await invoices.getJob('run-before-kill'))?.finishedOn).toBeNumber()

      second.proc.kill('SIGTERM')
      expect(await exitWithin(second.proc, 15_000)).toBe(0)
    } finally {
      await stop(first)
      await stop(second)
      await closeContext(ctx)
    }
  }, 90_000)

  test('`invoices:run --at` issues the ended periods and says how many; again, none; a bad time is exit 2', async () => {
    const ctx = await context()
    try {
      const at = new Date()
      const expected = await seedEndedPeriods(ctx, 4, at)
      expect(expected).toBe(12)
      const env = environment(ctx)

      const run = start(['src/cli/invoices-run.ts', '--at', at.toISOString()], env)
      expect(await exitWithin(run.proc, 20_000)).toBe(0)
      const endedBy = new Date(at.getTime() - 60_000).toISOString()
      expect(await run.stdout).toBe(`issued ${expected} invoices dated ${at.toISOString()}, for periods ended by ${endedBy}\n`)
      expect(await run.stderr).toBe('')
      await expectInvoicedOnce(ctx, at, expected)

      // The package script, as an operator runs it.
      const again = start(['run', 'invoices:run', '--at', at.toISOString()], env)
      expect(await exitWithin(again.proc, 20_000)).toBe(0)
      expect(await again.stdout).toContain(`issued 0 invoices dated ${at.toISOString()}, for periods ended by ${endedBy}\n`)
      await expectInvoicedOnce(ctx, at, expected)

      // What Date reads but no ISO 8601 time is: `5` is May 2001, and a European's 1 December 2026 is 12 January.
      for (const time of ['not-a-date', '5', '01/12/2026', 'Dec 1 2026']) {
        const bad = start(['src/cli/invoices-run.ts', '--at', time], env)
        expect({ time, code: await exitWithin(bad.proc, 20_000) }).toEqual({ time, code: 2 })
        expect(await bad.stdout).toBe('')
        const lines = (await bad.stderr).trimEnd().split('\n')
        expect(lines).toHaveLength(1)
        expect(lines[0]).toContain('--at must be an ISO 8601 time')
      }
      const ahead = start(['src/cli/invoices-run.ts', '--at', new Date(Date.now() + 32 * 86_400_000).toISOString()], env)
      expect(await exitWithin(ahead.proc, 20_000)).toBe(2)
      expect((await ahead.stderr).trimEnd()).toBe('invoices:run: --at must not be more than a minute ahead of the database’s clock')
      expect(await int(ctx.deps.sql`select count(*)::int as n from invoices`)).toBe(expected)
    } finally {
      await closeContext(ctx)
    }
  }, 60_000)
})
