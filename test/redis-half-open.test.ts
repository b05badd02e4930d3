/**
 * Redis connections that go half-open (left open, nothing coming back: a proxy that stopped
 * forwarding, a NAT that forgot the flow) are found out and replaced by new ones.
 */
import { expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { Queue } from 'bullmq'
import { Redis } from 'ioredis'
import { connectRedis, createRedis, isRedisUnavailable } from '../src/redis.ts'
import { createLog } from '../src/log.ts'
import { createAgent, createTestContext, signUp } from './helpers/context.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { listen, serve } from './helpers/sse.ts'
import { until } from './helpers/until.ts'
import { startWorker } from './helpers/workers.ts'

test('connections that stop answering are replaced: requests, jobs, events and the caches recover', async () => {
  const server = await startRedisServer()
  const proxy = await startHeldProxy(server.url)
  // A (the API, an actor runtime, the relay, a BullMQ worker) reaches Redis through the proxy; B, another
  // instance, straight. B relays nothing: what reaches A's streams went through A's connections.
  const a = await createTestContext({ env: { REDIS_URL: proxy.url }, actors: true })
  const b = await createTestContext({ database: a.database, env: { REDIS_URL: server.url, REDIS_PREFIX: a.config.redisPrefix }, relay: false })
  const http = serve(a.app)
  const queue = new Queue('half-open', { connection: a.deps.queues.connection, prefix: a.deps.keys.bullPrefix })
  const processed: string[] = []
  const worker = await startWorker(a.deps, 'half-open', async job => void processed.push(job.name))
  const owner = await signUp(a)
  const stream = listen(`${http.url}/v1/events/stream`, { token: owner.token })
  try {
    const agent = await createAgent(a, owner)
    const plan = await a.call('POST', '/v1/billing/plans', {
      token: owner.token,
      body: { participantId: agent.id, name: 'P', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 },
    })
    const subscribe = async () => {
      const user = await signUp(b)
      const idempotencyKey = randomUUID()
      // Retried under one key until it is answered: committed once, whatever the attempts were told.
      await until(async () => {
        const answer = await a.call('POST', '/v1/billing/subscriptions', {
          token: user.token,
          headers: { 'idempotency-key': idempotencyKey },
          body: { planId: plan.body.data.id },
        })
        return answer.status === 201
      }, 20_000)
    }
    // In use before the stall: an event on the stream, a job worked, an API key cached.
    await subscribe()
    await stream.waitFor(1, ['subscription.created'])
    await queue.add('before', {})
    await until(async () => processed.includes('before'), 5000)
    const key = (await a.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name: 'cached' } })).body.data
    expect((await a.call('GET', '/v1/auth/me', { token: key.key })).status).toBe(200)

    // Every connection open goes quiet for good; new ones get through.
    proxy.stall()
    const stalledAt = Date.now()
    const sseToken = async () => (await a.call('POST', '/v1/auth/sse-token', { token: owner.token })).status === 200
    expect(await sseToken()).toBe(false)
    await until(sseToken, 15_000)
    expect(Date.now() - stalledAt).toBeLessThan(10_000)

    // BullMQ's connections (no command timeout: replaced after 10 s) and the subscriber's (it sends
    // nothing) were replaced too.
    const added = queue.add('after', {})
    await until(async () => processed.includes('after'), 25_000)
    await added
    await subscribe()
    await stream.waitFor(2, ['subscription.created'], 15_000)
    await until(async () => a.deps.pubsub.listening(), 5000)

    // A revocation announced over pub/sub by B reaches A's key cache (filled again just before).
    expect((await a.call('GET', '/v1/auth/me', { token: key.key })).status).toBe(200)
    expect((await b.call('DELETE', `/v1/auth/api-keys/${key.id}`, { token: owner.token })).status).toBe(200)
    await until(async () => (await a.call('GET', '/v1/auth/me', { token: key.key })).status === 401, 1000)
  } finally {
    // The stalled connections dropped, so that a process that never noticed them can close.
    await proxy.stop()
    await proxy.restart()
    stream.close()
    await http.stop()
    await worker.stop()
    await queue.close()
    await proxy.close()
    await b.close()
    await a.close()
    await server.close()
  }
}, 90_000)

test('a command connection replaced while Redis is stalled sends none of its commands again', async () => {
  const server = await startRedisServer()
  const redis = createRedis(server.url, createLog('error'), 'commands')
  const other = new Redis(server.url)
  try {
    await connectRedis(redis, server.url)
    let closed = 0
    redis.on('close', () => closed++)
    // A script of 4.5 s holds Redis without a word (under its 5 s busy threshold, nobody is told BUSY):
    // the connection's PING goes unanswered for its 3 s, and it is replaced.
    const stalled = other.eval(
      `local function ms() local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000) end
       local start = ms()
       repeat until ms() - start >= 4500
       return 1`,
      0,
    )
    await Bun.sleep(200)
    const counted = await redis.incr('counted').catch((error: Error) => error)
    // Its own timeout, or the connection replaced under it: either way the caller hears of no result.
    expect(['Command timed out', 'Connection is closed.']).toContain((counted as Error).message)
    await stalled
    await until(async () => redis.status === 'ready' && (await redis.ping()) === 'PONG', 10_000)
    // The connection was replaced, not merely waited out.
    expect(closed).toBeGreaterThan(0)
    // Redis ran the INCR it had received once the script ended; the caller took its timeout as the
    // outcome, and the new connection did not send it a second time.
    expect(await other.get('counted')).toBe('1')
  } finally {
    redis.disconnect()
    other.disconnect()
    await server.close()
  }
}, 30_000)

test('a command in flight when its connection drops fails at once, not at its timeout', async () => {
  const server = await startRedisServer()
  const redis = createRedis(server.url, createLog('error'), 'commands')
  const admin = new Redis(server.url)
  try {
    await connectRedis(redis, server.url)
    const id = await redis.client('ID')
    const started = performance.now()
    // Waits 2 s on Redis, under the 3 s command timeout: only the drop can end it sooner.
    const waiting = redis.blpop(`never-${randomUUID()}`, 2).catch((error: Error) => error)
    await Bun.sleep(100)
    await admin.client('KILL', 'ID', String(id))
    const failed = await waiting
    expect((failed as Error).message).toBe('Connection is closed.')
    expect(isRedisUnavailable(failed)).toBe(true)
    expect(performance.now() - started).toBeLessThan(1500)
    // The connection comes back for the next command.
    await until(async () => (await redis.ping().catch(() => null)) === 'PONG', 5000)
  } finally {
    redis.disconnect()
    admin.disconnect()
    await server.close()
  }
})
