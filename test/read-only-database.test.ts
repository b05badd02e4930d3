/**
 * A database that refuses writes (a hot standby that a failover's DNS or proxy led the pool to, or a
 * demoted primary fenced read-only): Postgres answers `cannot execute ... in a read-only transaction`
 * (25006). That is an outage, as a Redis replica's READONLY is: 503 `unavailable`, never 500, and an
 * actor's command waits to be applied rather than being counted as failing.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createAgent, createTestContext, expectError, signUp, type TestContext, type TestUser } from './helpers/context.ts'
import { isOutage } from '../src/actors/work.ts'

let ctx: TestContext
let alice: TestUser
let admin: postgres.Sql

beforeAll(async () => {
  ctx = await createTestContext()
  alice = await signUp(ctx, 'alice')
  admin = postgres(ctx.database.url, { max: 1, onnotice: () => {} })
})
afterAll(async () => {
  await admin.end()
  // A pool whose connections were ended under it may take its end()'s 5 s timeout to close.
  await ctx.close()
}, 20_000)

/** Sets the database read-only or not for new sessions, and ends the service's sessions so its pool reconnects. */
async function readOnly(on: boolean) {
  const [row] = await admin<{ db: string }[]>`select current_database() as db`
  const db = row!.db
  await admin.unsafe(`alter database "${db}" set default_transaction_read_only = ${on ? 'on' : 'off'}`)
  await admin`select pg_terminate_backend(pid) from pg_stat_activity where datname = ${db} and pid <> pg_backend_pid()`
}

describe('a read-only database', () => {
  test('a write is 503 unavailable, not 500, and works once the database takes writes again', async () => {
    const agent = await createAgent(ctx, alice)
    await readOnly(true)
    try {
      // The first request may meet a connection the terminate cut (503 too); the ones after it are
      // on new, read-only sessions.
      for (let i = 0; i < 3; i++) {
        const res = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Read only' } })
        expectError(res, 503, 'unavailable')
      }
    } finally {
      await readOnly(false)
    }
    // Again the first request may meet a connection the terminate cut.
    const statuses: number[] = []
    for (let i = 0; i < 3 && statuses.at(-1) !== 200; i++) {
      statuses.push((await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: alice.token, body: { displayName: 'Writable' } })).status)
    }
    expect(statuses.at(-1)).toBe(200)
    expect(statuses.filter(status => status !== 503 && status !== 200)).toEqual([])
  })

  test('an actor’s turn refused so is an outage: the command is kept, not dead-lettered', () => {
    const error = Object.assign(new Error('cannot execute INSERT in a read-only transaction'), { code: '25006' })
    expect(isOutage(error)).toBe(true)
  })
})
