/**
 * A Redis whose limits someone else chose (a managed service, a shared instance): connections it
 * closes, a subscriber it cuts off for falling behind, clients it refuses. Each on a Redis of its own.
 */
import { afterAll, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { connectRedis, createRedis, isRedisUnavailable } from '../src/redis.ts'
import { createLog } from '../src/log.ts'
import { enqueueEvents } from '../src/events/outbox.ts'
import { createTestContext } from './helpers/context.ts'
import { startRedisServer, type RedisServer } from './helpers/redis-server.ts'
import { listen, serve } from './helpers/sse.ts'
import { until } from './helpers/until.ts'

const cleanups: (() => Promise<unknown>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {})
})

async function redisServer(): Promise<{ server: RedisServer; admin: Redis }> {
  const server = await startRedisServer()
  const admin = new Redis(server.url)
  cleanups.push(
    () => server.close(),
    async () => admin.disconnect(),
  )
  return { server, admin }
}

/** A log that keeps its records. */
function keptLog() {
  const records: { msg: string; connection?: string; heldBack?: number }[] = []
  return { records, log: createLog('info', line => void records.push(JSON.parse(line))) }
}

test('a connection Redis closes again and again is logged once, not once a close, and not as an outage; one this side closes is not', async () => {
  const { admin, server } = await redisServer()
  const { records, log } = keptLog()
  const subscriber = createRedis(server.url, log, 'subscriber')
  cleanups.push(async () => subscriber.disconnect())
  await connectRedis(subscriber, server.url)
  await subscriber.subscribe('limits:channel')
  // Closed by this side (as the probe replaces a connection that stopped answering): not Redis's doing.
  const replaced = new Promise(resolve => subscriber.once('ready', resolve))
  subscriber.stream.destroy()
  await replaced
  expect(records).toEqual([])
  for (let i = 0; i < 3; i++) {
    const back = new Promise(resolve => subscriber.once('ready', resolve))
    expect(await admin.client('KILL', 'TYPE', 'pubsub')).toBe(1)
    await back
  }
  await subscriber.quit()
  expect(records.map(record => [record.msg, record.connection])).toEqual([
    ['redis closed the connection; reconnected (CLIENT KILL, a client-output-buffer-limit, a restart?)', 'agent-marketplace:subscriber'],
  ])
})

test('a subscriber Redis cuts off at every burst of events (client-output-buffer-limit pubsub) loses no event for any stream', async () => {
  const { admin, server } = await redisServer()
  const { records, log } = keptLog()
  const ctx = await createTestContext({ env: { REDIS_URL: server.url }, log })
  const http = serve(ctx.app)
  cleanups.push(
    () => ctx.close(),
    () => http.stop(),
  )
  await admin.config('SET', 'client-output-buffer-limit', 'pubsub 32kb 8kb 5')
  // Chat streams that have received nothing yet: their clients have no id to resume from.
  const listeners = Array.from({ length: 3 }, () => listen(`${http.url}/v1/events/chat`))
  cleanups.push(async () => listeners.forEach(listener => listener.close()))
  await until(async () => ctx.deps.events.size === 3)
  // Every event goes to every API process's subscriber: other users' events (a relay pass sends up to
  // 64 users' at once, in one script) fill its output buffer past the limit.
  const chat = Array.from({ length: 100 }, () => randomUUID())
  for (let batch = 0; batch < chat.length; batch += 20) {
    const events = chat
      .slice(batch, batch + 20)
      .flatMap(id => [
        { userId: null, type: 'chat.message' as const, payload: { id, text: 'c'.repeat(480) } },
        ...Array.from({ length: 10 }, () => ({ userId: randomUUID(), type: 'invoice.issued' as const, payload: { pad: 'p'.repeat(2000) } })),
      ])
    await enqueueEvents(ctx.deps.sql, new Date(), events)
  }
  await until(async () => listeners.every(listener => listener.events.length >= chat.length), 30_000)
  for (const listener of listeners) expect(listener.events.map(event => event.data.id)).toEqual(chat)
  expect(server.output()).toContain('overcoming of output buffer limits')
  const closed = records.filter(record => record.msg.startsWith('redis closed the connection'))
  expect(closed.map(record => record.connection)).toEqual(['agent-marketplace:subscriber'])
}, 60_000)

test('a connection cut off at maxclients as it reconnects: its commands fail as an outage, the log says why once, and it comes back', async () => {
  const { admin, server } = await redisServer()
  const { records, log } = keptLog()
  const redis = createRedis(server.url, log, 'commands')
  cleanups.push(async () => redis.disconnect())
  await connectRedis(redis, server.url)
  // Room for the admin's connection only (Redis keeps those over the limit): this one, cut off, cannot
  // come back, as when other clients took every place meanwhile.
  await admin.config('SET', 'maxclients', '1')
  expect(await admin.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes')).toBe(1)
  await until(async () => records.some(record => record.msg === 'redis refuses new connections'))
  const failed = await redis.get('limits:key').catch((error: Error) => error)
  expect(isRedisUnavailable(failed)).toBe(true)
  await admin.config('SET', 'maxclients', '100')
  await until(async () => (await redis.ping().catch(() => null)) === 'PONG')
  const said = records.map(record => [record.msg, (record as { refusal?: string }).refusal])
  expect(said).toEqual([
    ['redis connection lost', undefined],
    ['redis refuses new connections', 'ERR max number of clients reached'],
    ['redis connection back', undefined],
  ])
}, 30_000)
