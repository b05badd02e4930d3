/** A proxy call's Idempotency-Key while its first request runs, and after the process running it died. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createTestContext, expectError, signUp, testJwtSecret, type CallResult, type TestContext, type TestUser } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { startWorker } from './helpers/workers.ts'
import { processGroup } from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'
import { until } from './helpers/until.ts'
import { meteringProcessor } from '../workers/metering.ts'
import { counted, meteredSubscriber, type MeteredSubscriber } from './helpers/usage.ts'

const connectionsKey = randomBytes(32).toString('hex')
const root = mkdtempSync(join(tmpdir(), 'am-in-flight-'))
const { start, killAll } = processGroup()
let ctx: TestContext
let upstream: Upstream
let worker: { stop(): Promise<void> }
let owner: TestUser

beforeAll(async () => {
  ctx = await createTestContext({ env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', CONNECTIONS_KEY: connectionsKey } })
  upstream = startUpstream()
  worker = await startWorker(ctx.deps, 'metering', meteringProcessor(ctx.deps))
  owner = await signUp(ctx)
})
afterAll(async () => {
  await killAll()
  upstream.openGate()
  await worker.stop()
  upstream.stop()
  await ctx.close()
  rmSync(root, { recursive: true, force: true })
})

type Setup = MeteredSubscriber

const setup = () => meteredSubscriber(ctx, owner, upstream.url)

const callBody = (s: Setup, path = '/gate') => ({ userId: s.user.id, provider: 'acme', method: 'GET', path })

const proxy = (s: Setup, key: string, path?: string) =>
  ctx.call('POST', '/v1/agent/proxy-call', { apiKey: s.agent.apiKey, body: callBody(s, path), headers: { 'idempotency-key': key } })

/** Calls the upstream received on /gate so far. */
const gateCalls = () => upstream.received.filter(request => request.path === '/api/gate').length

/** The 409 of a key whose first request still runs, with the seconds to wait before trying again. */
function expectInProgress(result: CallResult): number {
  expectError(result, 409, 'idempotency_key_in_progress')
  const retryAfter = result.headers.get('retry-after')
  expect(retryAfter).toMatch(/^[0-9]+$/)
  return Number(retryAfter)
}

describe('an Idempotency-Key whose first proxy call is still running', () => {
  test('is 409 idempotency_key_in_progress with Retry-After; another body is idempotency_key_reused; once answered it replays, metered once', async () => {
    const s = await setup()
    const before = gateCalls()
    upstream.closeGate()
    const first = proxy(s, 'in-flight-1')
    await until(async () => gateCalls() === before + 1)

    const seconds = expectInProgress(await proxy(s, 'in-flight-1'))
    expect(seconds).toBeGreaterThanOrEqual(1)
    expect(seconds).toBeLessThanOrEqual(10)
    expectError(await proxy(s, 'in-flight-1', '/echo'), 409, 'idempotency_key_reused')

    upstream.openGate()
    const answered = await first
    expect(answered.status).toBe(200)
    expect(await proxy(s, 'in-flight-1')).toMatchObject({ status: 200, body: answered.body })
    expectError(await proxy(s, 'in-flight-1', '/echo'), 409, 'idempotency_key_reused')
    expect(gateCalls()).toBe(before + 1)
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  })

  test('keeps it while it runs longer than the lease, renewing it', async () => {
    const s = await setup()
    upstream.closeGate()
    const first = proxy(s, 'in-flight-2')
    const reservedAt = async () => {
      const [row] = await ctx.deps.sql<{ at: Date }[]>`select created_at as at from idempotency_keys where key = 'in-flight-2'`
      return row?.at.getTime() ?? 0
    }
    await until(async () => (await reservedAt()) > 0)
    const reserved = await reservedAt()
    try {
      // 6 s on, the holder renews (every third of its 10 s lease); 12 s after the reservation and 6 s
      // after that renewal, the key is still in progress.
      ctx.clock.advance(6000)
      await until(async () => (await reservedAt()) >= reserved + 6000, 5000)
      ctx.clock.advance(6000)
      expect(expectInProgress(await proxy(s, 'in-flight-2'))).toBeGreaterThanOrEqual(3)
    } finally {
      upstream.openGate()
      ctx.clock.set(new Date())
    }
    expect((await first).status).toBe(200)
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
  })
})

describe('an Idempotency-Key whose proxy call died with its process', () => {
  test('is in progress until the lease lapses, within 10 s, then a retry calls again and is metered once', async () => {
    const s = await setup()
    const port = await freePort()
    const api = start(['src/main.ts', '--api'], {
      PATH: process.env.PATH!,
      HOME: process.env.HOME ?? root,
      DATABASE_URL: ctx.database.url,
      REDIS_URL: ctx.config.redisUrl,
      REDIS_PREFIX: ctx.config.redisPrefix,
      AUTH_JWT_SECRET: testJwtSecret,
      CONNECTIONS_KEY: connectionsKey,
      PROXY_ALLOWED_HOSTS: '127.0.0.1',
      LOG_LEVEL: 'error',
      NODE_ENV: 'development',
      PORT: String(port),
      DATA_DIR: mkdtempSync(join(root, 'data-')),
    })
    await until(async () => (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.status === 200, 20_000)

    const before = gateCalls()
    upstream.closeGate()
    const dying = fetch(`http://127.0.0.1:${port}/v1/agent/proxy-call`, {
      method: 'POST',
      headers: { 'x-api-key': s.agent.apiKey, 'content-type': 'application/json', 'idempotency-key': 'crashed-1' },
      body: JSON.stringify(callBody(s)),
    }).catch(() => null)
    await until(async () => gateCalls() === before + 1)
    // Its holder is alive in the other process.
    expectInProgress(await proxy(s, 'crashed-1'))

    api.proc.kill('SIGKILL')
    await api.proc.exited
    expect(await dying).toBeNull()
    upstream.openGate()

    // The holder last renewed at most a third of the lease (3.3 s) before it died: 5 s on, the
    // lease has not lapsed; 10.1 s on, it has.
    expectInProgress(await proxy(s, 'crashed-1'))
    ctx.clock.advance(5000)
    expect(expectInProgress(await proxy(s, 'crashed-1'))).toBeLessThanOrEqual(5)
    ctx.clock.advance(5100)
    const retried = await proxy(s, 'crashed-1')
    ctx.clock.set(new Date())
    expect(retried.status).toBe(200)
    expect(retried.body.data.status).toBe(200)
    // The upstream saw it twice (the first call reached it before its process died); it counts once.
    expect(gateCalls()).toBe(before + 2)
    expect(await counted(ctx, s.subscriptionId, 1)).toBe(1)
    expect(await proxy(s, 'crashed-1')).toMatchObject({ status: 200, body: retried.body })
  }, 40_000)
})
