/** Maintenance forgets what is past its keeping time, in batches however large the backlog, and keeps the rest. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { runMaintenance } from '../workers/maintenance.ts'

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(() => ctx.close())

const day = 86_400_000

describe('maintenance', () => {
  test('purges 12,001 old Idempotency-Key answers and applied commands (more than two statements’ worth) and an expired device code, nothing newer', async () => {
    const { sql, clock } = ctx.deps
    const now = clock.now()
    const old = new Date(now.getTime() - 3 * day)
    const recent = new Date(now.getTime() - 60_000)
    for (const [at, n, tag] of [
      [old, 12_001, 'old'],
      [recent, 3, 'new'],
    ] as const) {
      await sql`
        insert into idempotency_keys (subject, key, request_hash, response_status, response_body, created_at)
        select ${`maintenance:${tag}`}, i::text, '\\x00', 200, '{}', ${at} from generate_series(1, ${n}) as i
      `
      await sql`
        insert into actor_applied (actor, command_id, entry_id, result, applied_at)
        select ${`agent:maintenance-${tag}`}, i::text, '0-1', 'null', ${at} from generate_series(1, ${n}) as i
      `
      await sql`
        insert into device_codes (user_code, created_at, expires_at)
        values (${tag === 'old' ? 'BCDFGHJK' : 'LMNPQRST'}, ${at}, ${new Date(at.getTime() + 600_000)})
      `
    }
    const counts = await runMaintenance(ctx.deps)
    expect(counts).toMatchObject({ idempotencyKeys: 12_001, appliedCommands: 12_001, deviceCodes: 1 })
    const left = async (table: string) => (await sql<{ n: number }[]>`select count(*)::int as n from ${sql(table)}`)[0]!.n
    expect([await left('idempotency_keys'), await left('actor_applied'), await left('device_codes')]).toEqual([3, 3, 1])
    expect((await runMaintenance(ctx.deps)).idempotencyKeys).toBe(0)
  })
})
