import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import Redis from 'ioredis'
import { createAgent, createTestContext, expectError, signUp, uuidV7, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { freePort } from './helpers/ports.ts'
import { runMaintenance } from '../workers/maintenance.ts'
import { startActors } from '../workers/actors.ts'
import { until } from './helpers/until.ts'
import { holdDeactivation } from './helpers/deactivation.ts'
import { holdActor } from './helpers/hold.ts'

let ctx: TestContext
let owner: TestUser
let a: TestAgent
let b: TestAgent
let c: TestAgent

beforeAll(async () => {
  ctx = await createTestContext({ actors: true })
  owner = await signUp(ctx)
  a = await createAgent(ctx, owner)
  b = await createAgent(ctx, await signUp(ctx))
  c = await createAgent(ctx, await signUp(ctx))
})
afterAll(() => ctx.close())

const request = (from: TestAgent, body: Record<string, unknown>, headers?: Record<string, string>) =>
  ctx.call('POST', '/v1/agent/service-requests', { apiKey: from.apiKey, body, headers })
const respond = (as: TestAgent, body: Record<string, unknown>) => ctx.call('POST', '/v1/agent/service-respond', { apiKey: as.apiKey, body })
const get = (as: TestAgent, id: string) => ctx.call('GET', `/v1/agent/service-requests/${id}`, { apiKey: as.apiKey })
const requestsOf = async (agent: TestAgent) => (await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })).body.data.serviceRequests

describe('service requests between agents', () => {
  test('A asks B by id; B sees it in its events; B answers once; A reads the answer', async () => {
    const created = await request(a, { targetAgentId: b.id, serviceTag: 'summarise', input: 'Please summarise X' })
    expect(created.status).toBe(201)
    expect(created.body.data).toMatchObject({ status: 'pending' })
    const id = created.body.data.requestId
    expect(id).toMatch(uuidV7)
    expect(await requestsOf(b)).toEqual([
      {
        requestId: id,
        fromAgentId: a.id,
        fromAgentName: a.name,
        serviceTag: 'summarise',
        input: 'Please summarise X',
        createdAt: created.body.data.createdAt,
      },
    ])
    expect(await requestsOf(a)).toEqual([])
    expect((await get(a, id)).body.data).toMatchObject({ status: 'pending', output: null, success: null, respondedAt: null })

    expectError(await respond(a, { requestId: id, output: 'not mine', success: true }), 404, 'not_found')
    expectError(await respond(c, { requestId: id, output: 'not mine', success: true }), 404, 'not_found')
    const answered = await respond(b, { requestId: id, output: 'Summary', success: true })
    expect(answered.status).toBe(200)
    expect(answered.body.data).toEqual({ requestId: id, status: 'completed' })
    expectError(await respond(b, { requestId: id, output: 'again', success: false }), 409, 'already_responded')
    expect(await requestsOf(b)).toEqual([])
    const seen = (await get(a, id)).body.data
    expect(seen).toMatchObject({ requestId: id, fromAgentId: a.id, targetAgentId: b.id, status: 'completed', output: 'Summary', success: true })
    expect(seen.respondedAt).not.toBeNull()
    expect((await get(b, id)).status).toBe(200)
    expectError(await get(c, id), 404, 'not_found')
  })

  test('by name, a failed answer, and validation of the target', async () => {
    const created = await request(a, { targetAgentName: b.name, input: 'do it' })
    expect(created.status).toBe(201)
    const answered = await respond(b, { requestId: created.body.data.requestId, output: 'could not', success: false })
    expect(answered.body.data.status).toBe('failed')
    expectError(await request(a, { input: 'no target' }), 400, 'validation_failed')
    expectError(await request(a, { targetAgentId: b.id, targetAgentName: b.name, input: 'both' }), 400, 'validation_failed')
    expectError(await request(a, { targetAgentName: 'no-such-agent', input: 'x' }), 404, 'not_found')
    expectError(await request(a, { targetAgentId: '00000000-0000-4000-8000-000000000000', input: 'x' }), 404, 'not_found')
    expectError(await request(a, { targetAgentId: b.id, input: 'x'.repeat(50_001) }), 400, 'validation_failed')
    expect((await request(a, { targetAgentId: b.id, input: 'x'.repeat(50_000) })).status).toBe(201)
    expectError(
      await ctx.call('POST', '/v1/agent/service-requests', { token: owner.token, body: { targetAgentId: b.id, input: 'x' } }),
      403,
      'forbidden',
    )
    expectError(await respond(b, { requestId: '00000000-0000-4000-8000-000000000000', output: 'x', success: true }), 404, 'not_found')
  })

  test('expire after 24 h: gone from events, shown as expired, no longer answerable', async () => {
    const target = await createAgent(ctx, await signUp(ctx))
    const created = await request(a, { targetAgentId: target.id, input: 'slow job' })
    const id = created.body.data.requestId
    expect((await requestsOf(target)).length).toBe(1)
    ctx.clock.advance(24 * 3_600_000 + 1000)
    expect(await requestsOf(target)).toEqual([])
    expect((await get(a, id)).body.data.status).toBe('expired')
    expectError(await respond(target, { requestId: id, output: 'late', success: true }), 404, 'not_found')
    ctx.clock.set(new Date())
  })

  test('maintenance drops an expired request from the inbox in Redis, on a later run when Redis refused the first', async () => {
    const target = await createAgent(ctx, await signUp(ctx))
    const id = (await request(a, { targetAgentId: target.id, input: 'never answered' })).body.data.requestId
    expect((await requestsOf(target)).length).toBe(1)
    const requests = ctx.deps.keys.agent(target.id).requests
    expect(await ctx.deps.redis.hexists(requests, id)).toBe(1)
    ctx.clock.advance(24 * 3_600_000 + 1000)
    // A client with no server behind it: every command is refused at once.
    const away = new Redis(`redis://127.0.0.1:${await freePort()}`, { lazyConnect: true, enableOfflineQueue: false, retryStrategy: () => null })
    away.on('error', () => {})
    try {
      await runMaintenance({ ...ctx.deps, redis: away }).catch(() => undefined)
      await runMaintenance(ctx.deps)
    } finally {
      away.disconnect()
      ctx.clock.set(new Date())
    }
    expect(await ctx.deps.redis.hexists(requests, id)).toBe(0)
    expect((await get(a, id)).body.data.status).toBe('expired')
  })

  test('Idempotency-Key on service-requests creates one request', async () => {
    const target = await createAgent(ctx, await signUp(ctx))
    const headers = { 'idempotency-key': 'req-1' }
    const first = await request(a, { targetAgentId: target.id, input: 'once' }, headers)
    const again = await request(a, { targetAgentId: target.id, input: 'once' }, headers)
    expect(again.body.data).toEqual(first.body.data)
    expect((await requestsOf(target)).length).toBe(1)
    expectError(await request(a, { targetAgentId: target.id, input: 'twice' }, headers), 409, 'idempotency_key_reused')
  })

  test('a repeat while the first waits for its target’s actor is 409 in progress with Retry-After; then it replays', async () => {
    const target = await createAgent(ctx, await signUp(ctx))
    const headers = { 'idempotency-key': 'req-held' }
    const send = () => request(a, { targetAgentId: target.id, input: 'held once' }, headers)
    const mailbox = () => ctx.deps.redis.xlen(ctx.deps.keys.actor(`agent:${target.id}`).mailbox)
    // The target's actor held as another process would: the first's command waits in its mailbox.
    const letGo = (await holdActor(ctx.deps, `agent:${target.id}`, 30_000))!
    const first = send()
    await until(async () => (await mailbox()) === 1, 5000)
    const meanwhile = await send()
    expectError(meanwhile, 409, 'idempotency_key_in_progress')
    expect(meanwhile.headers.get('retry-after')).toMatch(/^([1-9]|10)$/)
    expect(await mailbox()).toBe(1)
    await letGo()
    const answered = await first
    expect(answered.status).toBe(201)
    const replay = await send()
    expect([replay.status, replay.body]).toEqual([201, answered.body])
    expect((await requestsOf(target)).length).toBe(1)
  })

  test('an agent sees only requests sent to it', async () => {
    const x = await createAgent(ctx, await signUp(ctx))
    const y = await createAgent(ctx, await signUp(ctx))
    await request(a, { targetAgentId: x.id, input: 'for x' })
    await request(a, { targetAgentId: y.id, input: 'for y' })
    expect((await requestsOf(x)).map((r: { input: string }) => r.input)).toEqual(['for x'])
    expect((await requestsOf(y)).map((r: { input: string }) => r.input)).toEqual(['for y'])
  })
})

describe('budgets of service requests', () => {
  let narrow: TestContext
  beforeAll(async () => {
    narrow = await createTestContext({
      actors: true,
      env: {
        // The helper's generous rules, but a sender may send 12 an hour; 8 open requests (40,000 bytes) per target.
        RATE_LIMITS: JSON.stringify({
          participantCreate: { capacity: 10000, perSeconds: 1 },
          serviceRequestCreate: { capacity: 12, perSeconds: 3600 },
        }),
        SERVICE_REQUESTS_OPEN_MAX: '8',
        SERVICE_REQUESTS_OPEN_BYTES: '40000',
      },
    })
  })
  afterAll(() => narrow.close())

  const send = (from: TestAgent, target: TestAgent, input: string) =>
    narrow.call('POST', '/v1/agent/service-requests', { apiKey: from.apiKey, body: { targetAgentId: target.id, input } })
  const agent = async () => createAgent(narrow, await signUp(narrow))
  const stored = async (target: TestAgent) =>
    (await narrow.deps.sql`select count(*)::int as n from service_requests where target_participant_id = ${target.id}`)[0]!.n
  const expectCapped = (result: Awaited<ReturnType<typeof send>>) => {
    expectError(result, 429, 'too_many_open_requests')
    expect(result.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/)
  }

  test('a sender past its serviceRequestCreate rate gets 429 rate_limited with Retry-After, and nothing is stored', async () => {
    const [from, target] = [await agent(), await agent()]
    for (let i = 0; i < 12; i++) {
      const result = await send(from, target, `job ${i}`)
      expect(result.status).toBe(201)
      // Answered, so that the target's caps stay out of the way.
      await narrow.call('POST', '/v1/agent/service-respond', {
        apiKey: target.apiKey,
        body: { requestId: result.body.data.requestId, output: 'done', success: true },
      })
    }
    const refused = await send(from, target, 'one too many')
    expectError(refused, 429, 'rate_limited')
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0)
    expect(await stored(target)).toBe(12)
    // Other senders have buckets of their own.
    expect((await send(await agent(), target, 'another sender')).status).toBe(201)
  })

  test('a target holds at most 8 open requests, a sender a quarter of them; answering one makes room', async () => {
    const target = await agent()
    const senders = [await agent(), await agent(), await agent(), await agent(), await agent()]
    const first = await send(senders[0]!, target, 'a')
    expect(first.status).toBe(201)
    expect((await send(senders[0]!, target, 'b')).status).toBe(201)
    expectCapped(await send(senders[0]!, target, 'c'))
    for (const sender of senders.slice(1, 4)) {
      for (const input of ['a', 'b']) expect((await send(sender, target, input)).status).toBe(201)
    }
    expectCapped(await send(senders[4]!, target, 'no room'))
    expect(await stored(target)).toBe(8)
    expect((await narrow.call('GET', '/v1/agent/events', { apiKey: target.apiKey })).body.data.serviceRequests).toHaveLength(8)

    const answered = await narrow.call('POST', '/v1/agent/service-respond', {
      apiKey: target.apiKey,
      body: { requestId: first.body.data.requestId, output: 'done', success: true },
    })
    expect(answered.status).toBe(200)
    expect((await send(senders[4]!, target, 'room now')).status).toBe(201)
    expectCapped(await send(senders[4]!, target, 'full again'))
  })

  test('the bytes of open inputs are capped as the inbox holds them: UTF-8 JSON strings, 10,000 a sender, 40,000 a target', async () => {
    const target = await agent()
    const senders = [await agent(), await agent(), await agent(), await agent(), await agent()]
    // 9,000 characters are 9,002 bytes as a JSON string; 4,000 "é" are 8,002 bytes.
    expect((await send(senders[0]!, target, 'x'.repeat(9000))).status).toBe(201)
    expectCapped(await send(senders[0]!, target, 'x'.repeat(1000)))
    expect((await send(senders[1]!, target, 'é'.repeat(4000))).status).toBe(201)
    expectCapped(await send(senders[1]!, target, 'é'.repeat(1000)))
    // Escapes count as what they take: 1,000 tabs are 2,002 bytes.
    expectCapped(await send(senders[1]!, target, '\t'.repeat(1000)))
    expect((await send(senders[2]!, target, 'x'.repeat(9000))).status).toBe(201)
    expect((await send(senders[3]!, target, 'x'.repeat(9000))).status).toBe(201)
    // 35,008 held: 4,992 more bytes fit, 4,998 do not, though only 4 of 8 requests are open.
    expectCapped(await send(senders[4]!, target, 'x'.repeat(4996)))
    expect((await send(senders[4]!, target, 'x'.repeat(4990))).status).toBe(201)

    const k = narrow.deps.keys.agent(target.id)
    const held = Object.values(await narrow.deps.redis.hgetall(k.requests)).map(entry => JSON.parse(entry).input as string)
    expect(held.reduce((sum, input) => sum + Buffer.byteLength(JSON.stringify(input)), 0)).toBeLessThanOrEqual(40_000)
  })

  test('expired requests no longer count', async () => {
    const [from, target] = [await agent(), await agent()]
    expect((await send(from, target, 'a')).status).toBe(201)
    expect((await send(from, target, 'b')).status).toBe(201)
    expectCapped(await send(from, target, 'c'))
    narrow.clock.advance(24 * 3_600_000 + 1000)
    try {
      expect((await send(from, target, 'c')).status).toBe(201)
    } finally {
      narrow.clock.set(new Date())
    }
  })
})

describe('a target deactivated while a request waits in its mailbox', () => {
  let idle: TestContext
  beforeAll(async () => {
    idle = await createTestContext({ actors: false, relay: false })
  })
  afterAll(() => idle.close())

  /** A request from a new agent to a new agent, checked by the route and queued: no runtime applies it yet. */
  async function queued() {
    const targetOwner = await signUp(idle)
    const [from, target] = [await createAgent(idle, await signUp(idle)), await createAgent(idle, targetOwner)]
    const sent = idle.call('POST', '/v1/agent/service-requests', { apiKey: from.apiKey, body: { targetAgentId: target.id, input: 'x' } })
    const mailbox = idle.deps.keys.actor(`agent:${target.id}`).mailbox
    await until(async () => (await idle.deps.redis.xlen(mailbox)) === 1)
    return { target, targetOwner, sent }
  }

  /** Applies what waits, then checks the request was refused and left nothing behind. */
  async function expectRefused(target: TestAgent, sent: ReturnType<typeof idle.call>, meanwhile: () => Promise<void> = async () => {}) {
    const runtime = await startActors(idle.deps, { leaseMs: 2000 })
    try {
      await meanwhile()
      expectError(await sent, 404, 'not_found')
    } finally {
      await runtime.stop()
    }
    const stored = idle.deps.sql`select count(*)::int as n from service_requests where target_participant_id = ${target.id}`
    expect((await stored)[0]!.n).toBe(0)
    const told = idle.deps.sql`select count(*)::int as n from outbox where type = 'service.requested' and data like ${`%${target.id}%`}`
    expect((await told)[0]!.n).toBe(0)
    expect(await idle.deps.redis.exists(idle.deps.keys.agent(target.id).requests)).toBe(0)
  }

  test('deactivated before it is applied: 404, nothing stored, its owner told nothing, its inbox left forgotten', async () => {
    const { target, targetOwner, sent } = await queued()
    expect((await idle.call('DELETE', `/v1/participants/${target.id}`, { token: targetOwner.token })).status).toBe(200)
    await expectRefused(target, sent)
  })

  test('deactivated as it is applied: the request waits for the deactivation, then is refused', async () => {
    const { target, targetOwner, sent } = await queued()
    const held = await holdDeactivation(idle.deps.sql, { id: target.id, ownerId: targetOwner.id })
    await expectRefused(target, sent, () => held.commitOnceWaited())
  })
})

describe('a target deactivated with requests waiting for its answer', () => {
  test('they read as expired to their senders at once; one it answered keeps its answer', async () => {
    const targetOwner = await signUp(ctx)
    const target = await createAgent(ctx, targetOwner)
    const waiting: string = (await request(a, { targetAgentId: target.id, input: 'still there?' })).body.data.requestId
    const answered: string = (await request(a, { targetAgentId: target.id, input: 'answered before' })).body.data.requestId
    expect((await respond(target, { requestId: answered, output: 'done', success: true })).status).toBe(200)
    expect((await get(a, waiting)).body.data.status).toBe('pending')

    expect((await ctx.call('DELETE', `/v1/participants/${target.id}`, { token: targetOwner.token })).status).toBe(200)
    expect((await get(a, waiting)).body.data).toMatchObject({ requestId: waiting, status: 'expired', output: null, respondedAt: null })
    expect((await get(a, answered)).body.data).toMatchObject({ requestId: answered, status: 'completed', output: 'done', success: true })
  })
})

describe('an agent deactivated while its own command waits in a mailbox', () => {
  let idle: TestContext
  beforeAll(async () => {
    idle = await createTestContext({ actors: false, relay: false })
  })
  afterAll(() => idle.close())

  /** Sends through the route and waits until the command is queued in `actor`'s mailbox: no runtime applies it yet. */
  async function queued(path: string, as: TestAgent, body: Record<string, unknown>, actor: TestAgent) {
    const mailbox = idle.deps.keys.actor(`agent:${actor.id}`).mailbox
    const before = await idle.deps.redis.xlen(mailbox)
    const sent = idle.call('POST', path, { apiKey: as.apiKey, body })
    await until(async () => (await idle.deps.redis.xlen(mailbox)) === before + 1)
    return { sent }
  }

  /** Applies what waits; the command is answered as its revoked key is from now on. */
  async function expectRevoked(sent: ReturnType<typeof idle.call>) {
    const runtime = await startActors(idle.deps, { leaseMs: 2000 })
    try {
      expectError(await sent, 401, 'invalid_token')
    } finally {
      await runtime.stop()
    }
  }

  const told = async (type: string, id: string) =>
    (await idle.deps.sql`select count(*)::int as n from outbox where type = ${type} and data like ${`%${id}%`}`)[0]!.n

  test('a target deactivated before its answer is applied: 401, the request stays unanswered, its sender’s owner told nothing', async () => {
    const targetOwner = await signUp(idle)
    const [from, target] = [await createAgent(idle, await signUp(idle)), await createAgent(idle, targetOwner)]
    const runtime = await startActors(idle.deps, { leaseMs: 2000 })
    const created = await idle.call('POST', '/v1/agent/service-requests', { apiKey: from.apiKey, body: { targetAgentId: target.id, input: 'x' } })
    await runtime.stop()
    expect(created.status).toBe(201)
    const requestId = created.body.data.requestId
    const { sent } = await queued('/v1/agent/service-respond', target, { requestId, output: 'done', success: true }, target)
    expect((await idle.call('DELETE', `/v1/participants/${target.id}`, { token: targetOwner.token })).status).toBe(200)
    await expectRevoked(sent)
    const [row] = await idle.deps.sql`select status, output from service_requests where id = ${requestId}`
    expect(row).toEqual({ status: 'pending', output: null })
    expect(await told('service.completed', requestId)).toBe(0)
  })

  test('a sender deactivated before its request is applied: 401, nothing stored, the target’s owner told nothing, its inbox untouched', async () => {
    const senderOwner = await signUp(idle)
    const [from, target] = [await createAgent(idle, senderOwner), await createAgent(idle, await signUp(idle))]
    const { sent } = await queued('/v1/agent/service-requests', from, { targetAgentId: target.id, input: 'x' }, target)
    expect((await idle.call('DELETE', `/v1/participants/${from.id}`, { token: senderOwner.token })).status).toBe(200)
    await expectRevoked(sent)
    const [stored] = await idle.deps.sql`select count(*)::int as n from service_requests where from_participant_id = ${from.id}`
    expect(stored!.n).toBe(0)
    expect(await told('service.requested', from.id)).toBe(0)
    expect(await idle.deps.redis.exists(idle.deps.keys.agent(target.id).requests)).toBe(0)
  })
})
