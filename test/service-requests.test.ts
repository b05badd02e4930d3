import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, signUp, uuidV7, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'

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

  test('Idempotency-Key on service-requests creates one request', async () => {
    const target = await createAgent(ctx, await signUp(ctx))
    const headers = { 'idempotency-key': 'req-1' }
    const first = await request(a, { targetAgentId: target.id, input: 'once' }, headers)
    const again = await request(a, { targetAgentId: target.id, input: 'once' }, headers)
    expect(again.body.data).toEqual(first.body.data)
    expect((await requestsOf(target)).length).toBe(1)
    expectError(await request(a, { targetAgentId: target.id, input: 'twice' }, headers), 409, 'idempotency_key_reused')
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
