/** Proxy calls' budgets: an agent's rate and calls in flight, and the process's upstream bytes, against a real slow upstream. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createTestContext, expectError, signUp, type CallResult, type TestContext, type TestUser } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { startWorker } from './helpers/workers.ts'
import { until } from './helpers/until.ts'
import { meteringProcessor } from '../workers/metering.ts'
import { counted, meteredSubscriber, type MeteredSubscriber } from './helpers/usage.ts'
import { inFlightLeaseMs } from '../src/proxy-calls/proxy.ts'

const connectionsKey = randomBytes(32).toString('hex')
let ctx: TestContext
let upstream: Upstream
let worker: { stop(): Promise<void> }
let owner: TestUser

const env = {
  PROXY_ALLOWED_HOSTS: '127.0.0.1',
  CONNECTIONS_KEY: connectionsKey,
  // Every rule generous but proxyCall: 6 an hour per agent. Two calls in flight per agent; 3 MiB: three calls' answers per process.
  RATE_LIMITS: JSON.stringify({ participantCreate: { capacity: 10000, perSeconds: 1 }, proxyCall: { capacity: 6, perSeconds: 3600 } }),
  PROXY_IN_FLIGHT_PER_AGENT: '2',
  PROXY_BUFFER_BYTES: String(3 * 1024 * 1024),
}

beforeAll(async () => {
  ctx = await createTestContext({ env })
  upstream = startUpstream()
  worker = await startWorker(ctx.deps, 'metering', meteringProcessor(ctx.deps))
  owner = await signUp(ctx)
})
afterAll(async () => {
  upstream.openGate()
  await worker.stop()
  upstream.stop()
  await ctx.close()
})

type Setup = MeteredSubscriber

const setup = () => meteredSubscriber(ctx, owner, upstream.url, { includedProxyCalls: 100 })

const proxy = (s: Setup, path = '/echo', headers?: Record<string, string>) =>
  ctx.call('POST', '/v1/agent/proxy-call', { apiKey: s.agent.apiKey, body: { userId: s.user.id, provider: 'acme', method: 'GET', path }, headers })

/** Calls the upstream received on /gate so far. */
const gateCalls = () => upstream.received.filter(request => request.path === '/api/gate').length

function expectRetryAfter(result: CallResult, status: number, code: string) {
  expectError(result, status, code)
  expect(result.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/)
}

describe('an agent’s proxy calls', () => {
  test('past the proxyCall rate: 429 rate_limited with Retry-After, the upstream not called', async () => {
    const s = await setup()
    for (let i = 0; i < 6; i++) expect((await proxy(s)).status).toBe(200)
    const before = upstream.received.length
    expectRetryAfter(await proxy(s), 429, 'rate_limited')
    expect(upstream.received.length).toBe(before)
    expect(await counted(ctx, s.subscriptionId, 6)).toBe(6)
    // Another agent has a bucket of its own.
    expect((await proxy(await setup())).status).toBe(200)
  })

  test('two in flight at once across processes: a third is 429 until one ends; other agents are not held up', async () => {
    // A second API process on the same database and Redis.
    const other = await createTestContext({ database: ctx.database, relay: false, env: { ...env, REDIS_PREFIX: ctx.config.redisPrefix } })
    try {
      const s = await setup()
      upstream.closeGate()
      const gate = gateCalls()
      const body = { userId: s.user.id, provider: 'acme', method: 'GET', path: '/gate' }
      const held = [proxy(s, '/gate'), other.call('POST', '/v1/agent/proxy-call', { apiKey: s.agent.apiKey, body })]
      await until(async () => gateCalls() === gate + 2, 5000)
      const before = upstream.received.length
      expectRetryAfter(await proxy(s), 429, 'rate_limited')
      expect(upstream.received.length).toBe(before)
      expect((await proxy(await setup())).status).toBe(200)

      upstream.openGate()
      for (const result of await Promise.all(held)) expect(result.status).toBe(200)
      expect((await proxy(s)).status).toBe(200)
    } finally {
      upstream.openGate()
      await other.close()
    }
  })

  test('a place left by a process that died mid-call is free again once its lease lapses', async () => {
    const s = await setup()
    // As a process that entered two calls and died would leave them: never exited.
    const rule = { name: 'proxyCall', max: 2, leaseMs: inFlightLeaseMs }
    await ctx.deps.inFlight.enter(rule, `agent:${s.agent.id}`)
    await ctx.deps.inFlight.enter(rule, `agent:${s.agent.id}`)
    expectRetryAfter(await proxy(s), 429, 'rate_limited')
    ctx.clock.advance(inFlightLeaseMs + 1)
    try {
      expect((await proxy(s)).status).toBe(200)
    } finally {
      ctx.clock.set(new Date())
    }
  })
})

describe('the process’s budget of upstream bytes', () => {
  test('three calls’ answers at once: a fourth is 503 with Retry-After, before the upstream is called and unmetered; room again once they end', async () => {
    const calls = [await setup(), await setup(), await setup()]
    const fourth = await setup()
    upstream.closeGate()
    const gate = gateCalls()
    const held = calls.map(s => proxy(s, '/gate'))
    await until(async () => gateCalls() === gate + 3, 5000)
    expect(ctx.deps.proxyBuffers.reserved).toBe(3 * 1024 * 1024)

    const before = upstream.received.length
    const headers = { 'idempotency-key': 'while-full' }
    expectRetryAfter(await proxy(fourth, '/echo', headers), 503, 'unavailable')
    expect(upstream.received.length).toBe(before)

    upstream.openGate()
    for (const result of await Promise.all(held)) expect(result.status).toBe(200)
    expect(ctx.deps.proxyBuffers.reserved).toBe(0)
    // Nothing happened under the key: the retry calls the upstream, once, and is metered once.
    expect((await proxy(fourth, '/echo', headers)).status).toBe(200)
    expect(upstream.received.length).toBe(before + 1)
    expect(await counted(ctx, fourth.subscriptionId, 1)).toBe(1)
  })

  test('a call that fails gives its reservation back', async () => {
    const s = await setup()
    expectError(await proxy(s, '/big'), 502, 'upstream_too_large')
    expect(ctx.deps.proxyBuffers.reserved).toBe(0)
  })
})
