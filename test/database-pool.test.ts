/** DATABASE_POOL_MAX sizes a process's pool for requests: statements beyond it wait for a connection. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createTestContext, type TestContext } from './helpers/context.ts'

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
