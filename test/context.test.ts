import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { ensureOrganization, newestEntries } from '../src/context/store.ts'
import type { ContextType } from '../src/context/schema.ts'
import { createAgent, createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { holdActor } from './helpers/hold.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let owner: TestUser

beforeAll(async () => {
  ctx = await createTestContext({ actors: true })
  owner = await signUp(ctx)
})
afterAll(() => ctx.close())

async function hire(user: TestUser, count: number): Promise<{ agents: TestAgent[]; subscriptions: string[] }> {
  const agents: TestAgent[] = []
  const subscriptions: string[] = []
  for (let i = 0; i < count; i++) {
    const agent = await createAgent(ctx, owner)
    const plan = await ctx.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const sub = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
    agents.push(agent)
    subscriptions.push(sub.body.data.id)
  }
  return { agents, subscriptions }
}

const agentWrite = (agent: TestAgent, body: Record<string, unknown>) => ctx.call('POST', '/v1/agent/context', { apiKey: agent.apiKey, body })
const agentRead = (agent: TestAgent, query: string) => ctx.call('GET', `/v1/agent/context?${query}`, { apiKey: agent.apiKey })

describe('agents sharing a subscriber’s knowledge', () => {
  test('100 concurrent writes to one entry from 5 agents yield exactly versions 1..100', async () => {
    const user = await signUp(ctx)
    const { agents } = await hire(user, 5)
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) =>
        agentWrite(agents[i % 5]!, {
          userId: user.id,
          type: 'keywords',
          key: 'seo',
          data: { n: i },
          confidence: 'derived',
          source: { method: 'analysis' },
        }),
      ),
    )
    expect(results.every(r => r.status === 201)).toBe(true)
    expect(results.map(r => r.body.data.version).sort((a, b) => a - b)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1))
    const versions = await ctx.call('GET', '/v1/context/keywords/seo/versions', { token: user.token })
    expect(versions.body.data.entries.map((e: { version: number }) => e.version)).toEqual(Array.from({ length: 100 }, (_, i) => 100 - i))
    const [row] = await ctx.deps.sql`
      select count(*)::int as n, count(distinct version)::int as distinct_versions, max(version) as max
      from context_entries where type = 'keywords' and key = 'seo'
    `
    expect(row).toEqual({ n: 100, distinct_versions: 100, max: 100 })
  })

  test('an entry written by agent A is read by agent B of the same subscriber, with its author and source', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a, b],
    } = await hire(user, 2)
    const written = await agentWrite(a!, {
      userId: user.id,
      type: 'brand',
      key: 'company',
      data: { name: 'Acme', mission: 'Rockets' },
      source: { method: 'website scrape' },
    })
    expect(written.status).toBe(201)
    expect(written.body.data).toMatchObject({
      type: 'brand',
      key: 'company',
      data: { name: 'Acme', mission: 'Rockets' },
      confidence: 'suggested',
      version: 1,
      source: { method: 'website scrape' },
      author: { kind: 'agent', id: a!.id },
    })
    const read = await agentRead(b!, `userId=${user.id}&type=brand`)
    expect(read.status).toBe(200)
    expect(read.body.data.entries).toEqual([written.body.data])
  })

  test('an agent the user does not subscribe to gets 403, and access ends when the subscription is cancelled', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
      subscriptions: [subscriptionId],
    } = await hire(user, 1)
    const stranger = await createAgent(ctx, owner)
    await agentWrite(a!, { userId: user.id, type: 'goals', key: 'q1', data: { grow: true } })
    expectError(await agentRead(stranger, `userId=${user.id}`), 403, 'not_subscribed')
    expectError(await agentWrite(stranger, { userId: user.id, type: 'goals', key: 'q1', data: {} }), 403, 'not_subscribed')
    await ctx.call('DELETE', `/v1/billing/subscriptions/${subscriptionId}`, { token: user.token })
    expectError(await agentRead(a!, `userId=${user.id}`), 403, 'not_subscribed')
    expectError(await agentWrite(a!, { userId: user.id, type: 'goals', key: 'q1', data: { more: 1 } }), 403, 'not_subscribed')
    const versions = await ctx.call('GET', '/v1/context/goals/q1/versions', { token: user.token })
    expect(versions.body.data.entries.length).toBe(1)
  })

  test('a user write blocks agent writes (409) until the user reverts to an agent version; every step is kept', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    const path = '/v1/context/tone/voice'
    await agentWrite(a!, { userId: user.id, type: 'tone', key: 'voice', data: { style: 'formal' }, confidence: 'derived' })
    const mine = await ctx.call('PUT', path, { token: user.token, body: { data: { style: 'playful' } } })
    expect(mine.status).toBe(200)
    expect(mine.body.data).toMatchObject({ version: 2, confidence: 'user_provided', author: { kind: 'user', id: user.id } })
    expectError(await agentWrite(a!, { userId: user.id, type: 'tone', key: 'voice', data: { style: 'stiff' } }), 409, 'user_provided_precedence')
    const reverted = await ctx.call('POST', `${path}/revert`, { token: user.token, body: { version: 1 } })
    expect(reverted.status).toBe(201)
    expect(reverted.body.data).toMatchObject({ version: 3, data: { style: 'formal' }, confidence: 'derived', source: { method: 'revert:v1' } })
    const again = await agentWrite(a!, { userId: user.id, type: 'tone', key: 'voice', data: { style: 'warm' } })
    expect(again.status).toBe(201)
    expect(again.body.data.version).toBe(4)
    const versions = await ctx.call('GET', `${path}/versions`, { token: user.token })
    expect(
      versions.body.data.entries.map((e: { version: number; confidence: string; data: { style: string } }) => [
        e.version,
        e.confidence,
        e.data.style,
      ]),
    ).toEqual([
      [4, 'suggested', 'warm'],
      [3, 'derived', 'formal'],
      [2, 'user_provided', 'playful'],
      [1, 'derived', 'formal'],
    ])
    const newest = await ctx.call('GET', '/v1/context?type=tone', { token: user.token })
    expect(newest.body.data.entries.map((e: { version: number }) => e.version)).toEqual([4])
  })

  test('reading lists the newest version of each entry ordered by type then key, filtered by type and key', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    for (const [type, key] of [
      ['team', 'b'],
      ['brand', 'z'],
      ['team', 'a'],
      ['brand', 'a'],
    ] as const) {
      await agentWrite(a!, { userId: user.id, type, key, data: { v: 1 } })
    }
    await agentWrite(a!, { userId: user.id, type: 'team', key: 'a', data: { v: 2 } })
    const all = (await agentRead(a!, `userId=${user.id}`)).body.data.entries
    expect(all.map((e: { type: string; key: string; version: number }) => `${e.type}/${e.key}@${e.version}`)).toEqual([
      'brand/a@1',
      'brand/z@1',
      'team/a@2',
      'team/b@1',
    ])
    const one = (await agentRead(a!, `userId=${user.id}&type=team&key=a`)).body.data.entries
    expect(one.map((e: { data: { v: number } }) => e.data.v)).toEqual([2])
    expect((await agentRead(a!, `userId=${user.id}&type=goals`)).body.data.entries).toEqual([])
  })

  test('reading the newest versions reads a few rows per entry, not every version of each', async () => {
    const user = await signUp(ctx)
    const orgId = await ensureOrganization(ctx.deps.sql, user.id, new Date())
    // One entry with 2,000 versions among a few small ones: every agent's read used to read (and sort) them all.
    await ctx.deps.sql`
      insert into context_entries (org_id, type, key, version, data, confidence, author_kind, author_id, created_at)
      select ${orgId}, type, key, v, jsonb_build_object('v', v), 'suggested', 'user', ${user.id}, now()
      from (values ('keywords', 'big', 2000), ('brand', 'a', 1), ('team', 'a', 3), ('keywords', 'small', 2), ('team', 'big', 1)) as e (type, key, n),
        generate_series(1, n) as v
    `
    const read = (filter: { type?: ContextType; key?: string }) =>
      ctx.deps.sql.begin(async tx => {
        // Planned as for a large table: a small one is read whole, whatever the statement.
        await tx`set local enable_seqscan = off`
        // Rows read from the table and its key (sequentially, through the index, and the index's own
        // entries), as a difference: Postgres 15 counts in what earlier transactions left unflushed.
        const counted = async () => {
          const [row] = await tx<{ rows: number }[]>`
            select (pg_stat_get_xact_tuples_returned('context_entries'::regclass) + pg_stat_get_xact_tuples_fetched('context_entries'::regclass)
              + pg_stat_get_xact_tuples_returned('context_entries_pkey'::regclass))::int as rows
          `
          return row!.rows
        }
        const before = await counted()
        const entries = await newestEntries(tx, orgId, filter)
        const rows = (await counted()) - before
        return { entries: entries.map(e => `${e.type}/${e.key}@${e.version}:${(e.data as { v: number }).v}`), rows }
      })
    const all = await read({})
    expect(all.entries).toEqual(['brand/a@1:1', 'keywords/big@2000:2000', 'keywords/small@2:2', 'team/a@3:3', 'team/big@1:1'])
    expect(all.rows).toBeLessThan(50)
    const ofType = await read({ type: 'keywords' })
    expect(ofType.entries).toEqual(['keywords/big@2000:2000', 'keywords/small@2:2'])
    expect(ofType.rows).toBeLessThan(50)
    const ofKey = await read({ key: 'big' })
    expect(ofKey.entries).toEqual(['keywords/big@2000:2000', 'team/big@1:1'])
    expect(ofKey.rows).toBeLessThan(50)
    const one = await read({ type: 'keywords', key: 'big' })
    expect(one.entries).toEqual(['keywords/big@2000:2000'])
    expect(one.rows).toBeLessThan(50)
    expect((await read({ type: 'goals' })).entries).toEqual([])
  })
})

describe('bad input writes nothing', () => {
  test('unknown types, bad keys, non-object or oversized data, and user_provided from an agent are refused', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    const base = { userId: user.id, type: 'custom', key: 'k', data: { ok: true } }
    expectError(await agentRead(a!, `userId=${user.id}&type=unknown`), 400, 'validation_failed')
    expectError(await agentRead(a!, 'type=brand'), 400, 'validation_failed')
    for (const body of [
      { ...base, type: 'unknown' },
      { ...base, key: '' },
      { ...base, key: 'has space' },
      { ...base, key: 'k'.repeat(101) },
      { ...base, data: [1, 2] },
      { ...base, data: 'text' },
      { ...base, data: null },
      { ...base, data: { big: 'x'.repeat(64 * 1024) } },
      // 3 KiB as sent, 150 KiB as Postgres keeps it: numbers are stored written out in full.
      { ...base, data: { a: Array.from({ length: 500 }, () => 1e300) } },
      { ...base, data: { a: Array.from({ length: 500 }, () => -1.5e-300) } },
      { ...base, confidence: 'certain' },
      { ...base, source: { note: 'no method' } },
      { ...base, extra: 1 },
    ]) {
      expectError(await agentWrite(a!, body), 400, 'validation_failed')
    }
    expectError(await agentWrite(a!, { ...base, confidence: 'user_provided' }), 403, 'confidence_not_allowed')
    // Nor the user's provenance, in any spelling: only the user's own credential writes it.
    for (const method of ['user', 'User', ' USER ', 'ｕｓｅｒ', 'user_provided', 'User-Provided', 'revert:v1', 'Revert: V12']) {
      for (const confidence of [undefined, 'derived', 'suggested']) {
        const refused = expectError(await agentWrite(a!, { ...base, confidence, source: { method } }), 403, 'confidence_not_allowed')
        expect(refused.details[0].path).toBe('/source/method')
      }
    }
    expectError(await ctx.call('PUT', '/v1/context/unknown/k', { token: user.token, body: { data: {} } }), 400, 'validation_failed')
    expectError(await ctx.call('PUT', '/v1/context/custom/k', { token: user.token, body: { data: [] } }), 400, 'validation_failed')
    // 3 KiB of JSON text, 75 KiB as stored: over the route's 64 KiB, under the database's own bound.
    for (const put of [
      () => ctx.call('PUT', '/v1/context/custom/k', { token: user.token, body: { data: { a: Array.from({ length: 250 }, () => 1e300) } } }),
      () => agentWrite(a!, { ...base, data: { a: Array.from({ length: 250 }, () => -1.5e-300) } }),
    ]) {
      const refused = expectError(await put(), 400, 'validation_failed')
      expect(refused.details).toEqual([{ path: '/data', message: 'must be at most 64 KiB' }])
    }
    const [row] = await ctx.deps.sql`select count(*)::int as n from context_entries where key = 'k'`
    expect(row!.n).toBe(0)
    expect((await agentWrite(a!, { ...base, data: { fits: 'x'.repeat(60 * 1024) } })).status).toBe(201)
    // 200 of them is 60 KiB written out: it fits, and is kept exactly.
    const numbers = { a: Array.from({ length: 200 }, () => 1e300) }
    const stored = await agentWrite(a!, { ...base, key: 'numbers', data: numbers })
    expect(stored.status).toBe(201)
    expect(stored.body.data.data).toEqual(numbers)
  })

  test('the user’s provenance padded with invisible letters (Hangul fillers) is refused as plain `user` is', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    // Letters to Unicode, but default-ignorable: shown as nothing, so each of these reads `user` or `revert:v1`.
    for (const method of ['user\u3164', '\u3164USER', 'u\u115Fser', 'user\uFFA0', 'use\u1160r', 'revert:v1\u3164', 'user_\u3164provided']) {
      const refused = expectError(
        await agentWrite(a!, { userId: user.id, type: 'custom', key: 'padded', data: {}, source: { method } }),
        403,
        'confidence_not_allowed',
      )
      expect(refused.details[0].path).toBe('/source/method')
    }
    expect((await ctx.call('GET', '/v1/context/custom/padded/versions', { token: user.token })).status).toBe(404)
  })

  test('an agent describes its own method freely; the user’s provenance comes only from the user’s credential', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    const written = await agentWrite(a!, {
      userId: user.id,
      type: 'tone',
      key: 'voice',
      data: { formal: true },
      source: { method: 'asked the user in chat' },
    })
    expect(written.status).toBe(201)
    expect(written.body.data).toMatchObject({ source: { method: 'asked the user in chat' }, author: { kind: 'agent', id: a!.id } })
    const own = await ctx.call('PUT', '/v1/context/tone/voice', { token: user.token, body: { data: { formal: false } } })
    expect(own.body.data).toMatchObject({ version: 2, source: { method: 'user' }, author: { kind: 'user', id: user.id } })
    // One with no method to give may send it empty, as the reference agent does by default.
    const bare = await agentWrite(a!, {
      userId: user.id,
      type: 'content_insights',
      key: 'topics',
      data: { top: ['launches'] },
      source: { method: '' },
    })
    expect(bare.status).toBe(201)
    const read = await agentRead(a!, `userId=${user.id}&type=content_insights`)
    expect(read.body.data.entries[0]).toMatchObject({ data: { top: ['launches'] }, source: { method: '' } })
  })

  test('user endpoints: unknown entries and versions are 404; credentials are checked', async () => {
    const user = await signUp(ctx)
    const {
      agents: [a],
    } = await hire(user, 1)
    expectError(await ctx.call('GET', '/v1/context/brand/none/versions', { token: user.token }), 404, 'not_found')
    expectError(await ctx.call('POST', '/v1/context/brand/none/revert', { token: user.token, body: { version: 1 } }), 404, 'not_found')
    await ctx.call('PUT', '/v1/context/brand/x', { token: user.token, body: { data: { a: 1 } } })
    expectError(await ctx.call('POST', '/v1/context/brand/x/revert', { token: user.token, body: { version: 9 } }), 404, 'not_found')
    expectError(await ctx.call('POST', '/v1/context/brand/x/revert', { token: user.token, body: { version: 0 } }), 400, 'validation_failed')
    // Versions are Postgres integers: one past them is refused by the schema, naming /version, as the document shows.
    expectError(await ctx.call('POST', '/v1/context/brand/x/revert', { token: user.token, body: { version: 2 ** 31 - 1 } }), 404, 'not_found')
    const huge = expectError(
      await ctx.call('POST', '/v1/context/brand/x/revert', { token: user.token, body: { version: 2 ** 31 } }),
      400,
      'validation_failed',
    )
    expect(huge.details).toEqual([{ path: '/version', message: expect.any(String) }])
    expectError(await ctx.call('GET', '/v1/context', { apiKey: a!.apiKey }), 403, 'forbidden')
    expectError(await ctx.call('GET', `/v1/agent/context?userId=${user.id}`, { token: user.token }), 403, 'forbidden')
    expectError(await ctx.call('GET', '/v1/context'), 401, 'unauthorized')
    const other = await signUp(ctx)
    expect((await ctx.call('GET', '/v1/context', { token: other.token })).body.data.entries).toEqual([])
  })

  test('writes honour Idempotency-Key: a retry is one version and the same answer; another body under the key is 409', async () => {
    const user = await signUp(ctx)
    const {
      agents: [agent],
    } = await hire(user, 1)
    const body = { userId: user.id, type: 'keywords', key: 'retried', data: { n: 1 }, confidence: 'derived' }
    const headers = { 'idempotency-key': 'agent-write-1' }
    const both = await Promise.all([1, 2].map(() => ctx.call('POST', '/v1/agent/context', { apiKey: agent!.apiKey, body, headers })))
    const again = await ctx.call('POST', '/v1/agent/context', { apiKey: agent!.apiKey, body, headers })
    expect(again.status).toBe(201)
    // Sent at once, whichever came second is the first's replay, or 409 while the first still runs (CONTRACT.md §9).
    for (const answer of both) {
      if (answer.status === 409) expectError(answer, 409, 'idempotency_key_in_progress')
      else expect(answer.body).toEqual(again.body)
    }
    expect(both.filter(answer => answer.status === 201).length).toBeGreaterThanOrEqual(1)
    const other = await ctx.call('POST', '/v1/agent/context', { apiKey: agent!.apiKey, body: { ...body, data: { n: 2 } }, headers })
    expectError(other, 409, 'idempotency_key_reused')

    const put = (data: object, key: string) =>
      ctx.call('PUT', '/v1/context/keywords/retried', { token: user.token, body: { data }, headers: { 'idempotency-key': key } })
    const mine = await put({ n: 3 }, 'user-write-1')
    expect((await put({ n: 3 }, 'user-write-1')).body).toEqual(mine.body)
    expectError(await put({ n: 4 }, 'user-write-1'), 409, 'idempotency_key_reused')

    const revert = () =>
      ctx.call('POST', '/v1/context/keywords/retried/revert', { token: user.token, body: { version: 1 }, headers: { 'idempotency-key': 'revert-1' } })
    const reverted = await revert()
    expect(reverted.status).toBe(201)
    expect((await revert()).body).toEqual(reverted.body)

    // One version for each request, however many times it was sent.
    const versions = await ctx.call('GET', '/v1/context/keywords/retried/versions', { token: user.token })
    expect(versions.body.data.entries.map((e: { version: number }) => e.version)).toEqual([3, 2, 1])
  })

  test('a repeat while the first write waits for its actor is 409 in progress with Retry-After; then it replays', async () => {
    const user = await signUp(ctx)
    const {
      agents: [agent],
    } = await hire(user, 1)
    const orgId = await ensureOrganization(ctx.deps.sql, user.id, ctx.clock.now())
    const body = { userId: user.id, type: 'keywords', key: 'held', data: { n: 1 }, confidence: 'derived' }
    const headers = { 'idempotency-key': 'held-write' }
    const write = () => ctx.call('POST', '/v1/agent/context', { apiKey: agent!.apiKey, body, headers })
    const versions = async () =>
      (await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from context_entries where org_id = ${orgId} and key = 'held'`)[0]!.n
    // The organization's actor held as another process would: the first's command waits in its mailbox.
    const letGo = (await holdActor(ctx.deps, `org:${orgId}`, 30_000))!
    const first = write()
    await until(async () => (await ctx.deps.redis.xlen(ctx.deps.keys.actor(`org:${orgId}`).mailbox)) === 1, 5000)
    const meanwhile = await write()
    expectError(meanwhile, 409, 'idempotency_key_in_progress')
    expect(meanwhile.headers.get('retry-after')).toMatch(/^([1-9]|10)$/)
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`org:${orgId}`).mailbox)).toBe(1)
    await letGo()
    const answered = await first
    expect(answered.status).toBe(201)
    const replay = await write()
    expect([replay.status, replay.body]).toEqual([201, answered.body])
    expect(await versions()).toBe(1)
  })

  test('the table is append-only: the database refuses updates and deletes', async () => {
    const user = await signUp(ctx)
    await ctx.call('PUT', '/v1/context/custom/locked', { token: user.token, body: { data: { a: 1 } } })
    await expect(ctx.deps.sql`update context_entries set data = '{}' where key = 'locked'`.then(() => 'updated')).rejects.toThrow('append-only')
    await expect(ctx.deps.sql`delete from context_entries where key = 'locked'`.then(() => 'deleted')).rejects.toThrow('append-only')
  })
})
