/** DATABASE_POOL_MAX sizes a process's pool for requests: statements beyond it wait for a connection; the reply writer's pool's settings. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { createSql } from '../src/db.ts'
import { replySettings } from '../src/deps.ts'

let ctx: TestContext
let observer: postgres.Sql

beforeAll(async () => {
  ctx = await createTestContext({ env: { DATABASE_POOL_MAX: '2' } })
  observer = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
})
afterAll(async () => {
  await observer.end()
  await ctx.close()
})

test('the request pool runs at most DATABASE_POOL_MAX statements at once, and every one of them', async () => {
  const statements = Array.from({ length: 6 }, (_, i) => ctx.deps.sql`select pg_sleep(0.3), ${i}::int as n, 'pool-probe' as probe`)
  let most = 0
  let finished = false
  const all = Promise.all(statements).finally(() => (finished = true))
  while (!finished) {
    const [row] = await observer<{ running: number }[]>`
      select count(*)::int as running from pg_stat_activity
      where datname = current_database() and state = 'active' and query like '%pool-probe%' and pid <> pg_backend_pid()
    `
    most = Math.max(most, row!.running)
    await Bun.sleep(20)
  }
  expect((await all).map(([row]) => row!.n)).toEqual([0, 1, 2, 3, 4, 5])
  expect(most).toBe(2)
})

test('the request pool compiles nothing: a plan priced past jit_above_cost runs without JIT', async () => {
  // A page of a user's subscriptions was priced so (their missing periods made first), and compiled
  // at each read for longer than it ran: 0.8 to 1.5 s for 50 or 100 of them. The threshold is brought
  // down to the plan: PostgreSQL 18 no longer prices a disabled sequential scan past it.
  const explained = await ctx.deps.sql.begin(async tx => {
    await tx`set local jit_above_cost = 0`
    return tx.unsafe(
      `explain (analyze, format json) select b.oid, b.typarray from pg_catalog.pg_type a
       left join pg_catalog.pg_type b on b.oid = a.typelem where a.typcategory = 'A' group by b.oid, b.typarray order by b.oid`,
    )
  })
  const [plan] = (explained[0] as unknown as { 'QUERY PLAN': { Plan: { 'Total Cost': number }; JIT?: unknown }[] })['QUERY PLAN']
  expect(plan!.Plan['Total Cost']).toBeGreaterThan(0)
  expect(plan!.JIT).toBeUndefined()
})

test('the reply writer’s connections price out sequential scans and compile nothing: the driver’s catalog query runs without JIT', async () => {
  const replies = createSql(ctx.database.url, { max: 1, settings: replySettings })
  try {
    const [settings] = await replies<{ seqscan: string; jit: string }[]>`
      select current_setting('enable_seqscan') as seqscan, current_setting('jit') as jit
    `
    expect(settings).toEqual({ seqscan: 'off', jit: 'off' })
    // What postgres.js asks first on every connection (its array types): a plan that must scan, so
    // priced past jit_above_cost, where Postgres would spend a few hundred milliseconds compiling it.
    const [explained] = await replies.unsafe(
      `explain (analyze, format json) select b.oid, b.typarray from pg_catalog.pg_type a
       left join pg_catalog.pg_type b on b.oid = a.typelem where a.typcategory = 'A' group by b.oid, b.typarray order by b.oid`,
    )
    expect((explained as unknown as { 'QUERY PLAN': { JIT?: unknown }[] })['QUERY PLAN'][0]!.JIT).toBeUndefined()
  } finally {
    await replies.end()
  }
})
