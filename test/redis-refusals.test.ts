/**
 * A Redis that is up but refuses commands for now (out of memory under `noeviction`, say) is an
 * outage like one that is down: requests are 503 `unavailable`, not 500, and actors retry rather
 * than count the failure against the command.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Redis } from 'ioredis'
import { EventEmitter } from 'node:events'
import { connectRedis, createRedis, defineBatchedScript, isRedisUnavailable, reportQueueErrors } from '../src/redis.ts'
import { createLog } from '../src/log.ts'
import { isOutage } from '../src/actors/work.ts'
import { createTestContext, expectError, signUp, subscribedPair, type TestContext } from './helpers/context.ts'
import { startRedisServer, type RedisServer } from './helpers/redis-server.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { until } from './helpers/until.ts'

let server: RedisServer
let admin: Redis
let ctx: TestContext

beforeAll(async () => {
  server = await startRedisServer()
  admin = new Redis(server.url)
  ctx = await createTestContext({ env: { REDIS_URL: server.url }, actors: true })
})

afterAll(async () => {
  await admin.config('SET', 'maxmemory', '0').catch(() => {})
  await ctx?.close()
  admin?.disconnect()
  await server?.close()
})

/** Redis refuses every write (maxmemory below what it holds, `noeviction`) while `body` runs. */
async function outOfMemory<T>(body: () => Promise<T>): Promise<T> {
  await admin.config('SET', 'maxmemory', '1')
  try {
    return await body()
  } finally {
    await admin.config('SET', 'maxmemory', '0')
  }
}

describe('a Redis out of memory', () => {
  test('its refusals, alone or inside a MULTI, count as Redis unavailable', async () => {
    const key = `refusals:${Date.now()}`
    const [alone, multi] = await outOfMemory(async () => [
      await admin.set(key, 'x').catch((error: unknown) => error),
      await admin
        .multi()
        .get(key)
        .set(key, 'x')
        .exec()
        .catch((error: unknown) => error),
    ])
    expect((alone as Error).message).toStartWith('OOM ')
    expect((multi as Error).message).toStartWith('EXECABORT ')
    expect(isRedisUnavailable(alone)).toBe(true)
    expect(isRedisUnavailable(multi)).toBe(true)
    expect(isOutage(alone)).toBe(true)
    // A MULTI refused for a reason of its own (a wrong command) is no outage.
    const wrong = await admin
      .multi()
      .call('NO-SUCH-COMMAND')
      .exec()
      .catch((error: unknown) => error)
    expect(isRedisUnavailable(wrong)).toBe(false)
  })

  test('requests that write to it are 503 unavailable, and succeed once it has room again', async () => {
    const owner = await signUp(ctx)
    const { agent, user } = await subscribedPair(ctx, owner)
    const sent = { token: user.token, body: { text: 'while Redis is full' } }
    const answers = await outOfMemory(async () => ({
      message: await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, sent),
      chat: await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'full' } }),
      context: await ctx.call('POST', '/v1/agent/context', {
        apiKey: agent.apiKey,
        body: { userId: user.id, type: 'custom', key: 'k', data: { a: 1 } },
      }),
    }))
    for (const answer of Object.values(answers)) expectError(answer, 503, 'unavailable')

    const after = await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, sent)
    expect(after.status).toBe(201)
  })
})

describe('a queue’s errors', () => {
  test('a refusal of Redis (out of memory, a replica) is logged; a lost connection is left to its own outage record', () => {
    const lines: string[] = []
    const log = createLog('warn', line => lines.push(line))
    const queue = new EventEmitter()
    reportQueueErrors(queue, log, { queue: 'metering' })
    const refused = (message: string) => Object.assign(new Error(message), { name: 'ReplyError' })
    queue.emit('error', refused('READONLY You can’t write against a read only replica.'))
    queue.emit('error', refused('OOM command not allowed when used memory > ’maxmemory’.'))
    queue.emit('error', Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' }))
    queue.emit('error', new Error('Connection is closed.'))
    expect(lines.map(line => JSON.parse(line).error)).toEqual([
      'READONLY You can’t write against a read only replica.',
      'OOM command not allowed when used memory > ’maxmemory’.',
    ])
  })
})

describe('a failover', () => {
  /**
   * Two servers, the old primary and the one to be promoted, and the name the service connects to
   * (the old primary now); `demote` makes the old one a replica of the promoted one.
   */
  const failoverPair = async () => {
    const [old, promoted] = [await startRedisServer(), await startRedisServer()]
    const name = await startHeldProxy(old.url)
    const admin = new Redis(old.url)
    const reader = new Redis(promoted.url)
    return {
      name,
      reader,
      demote: () => admin.call('REPLICAOF', '127.0.0.1', String(new URL(promoted.url).port)),
      promotedUrl: promoted.url,
      async close() {
        admin.disconnect()
        reader.disconnect()
        await name.close()
        await old.close()
        await promoted.close()
      },
    }
  }

  test('a connection left on the old primary, now a replica (READONLY), reconnects and reaches the new one', async () => {
    const { name, reader, demote, promotedUrl, close } = await failoverPair()
    const lines: string[] = []
    const redis = createRedis(
      name.url,
      createLog('warn', line => lines.push(line)),
      'commands',
    )
    let reconnects = 0
    redis.on('reconnecting', () => reconnects++)
    try {
      await connectRedis(redis, name.url)
      await redis.set('written', 'before')
      // The old primary follows the promoted server; the name still leads to it for a moment.
      await demote()
      const refused = await Promise.all([redis.set('written', 'one'), redis.set('written', 'two')].map(p => p.catch((error: Error) => error)))
      expect(refused.map(error => (error as Error).message.slice(0, 9))).toEqual(['READONLY ', 'READONLY '])
      await until(async () => reconnects > 0 && redis.status === 'ready', 5000)
      // Two writes refused at once: one reconnect, and one warning.
      // Refused again at once, on the connection that came back to the old primary: no second
      // reconnect within 2 s, which would cut its other commands short again.
      expect(((await redis.set('written', 'three').catch((error: Error) => error)) as Error).message).toStartWith('READONLY ')
      await Bun.sleep(200)
      expect(reconnects).toBe(1)
      expect(lines.map(line => JSON.parse(line).msg)).toEqual(['redis connection refused writes (a replica: failover?); reconnecting'])
      // The name moves to the promoted server: the next reconnect reaches it.
      name.retarget(promotedUrl)
      await until(async () => (await redis.set('written', 'after').catch(() => null)) === 'OK', 10_000)
      expect(await reader.get('written')).toBe('after')
    } finally {
      redis.disconnect()
      await close()
    }
  })

  test('a connection that runs only batched scripts reconnects too, its calls refused by the old primary as outages', async () => {
    // The reply writer's connection and the outbox relay's run nothing else: a READONLY caught in
    // each call's place left them on the old primary for good (replies never projected, events never relayed).
    const { name, reader, demote, promotedUrl, close } = await failoverPair()
    const redis = createRedis(
      name.url,
      createLog('error', () => {}),
      'commands',
    )
    const set = defineBatchedScript(`redis.call('SET', K[1], A[1]) return A[1]`, 1, 1)
    try {
      await connectRedis(redis, name.url)
      expect(await set(redis, ['written'], ['before'])).toBe('before')
      await demote()
      // The name leads to the promoted server at once; the connection is still on the old one.
      name.retarget(promotedUrl)
      const refused = await Promise.all(['one', 'two'].map(value => set(redis, ['written'], [value]).catch((error: Error) => error)))
      for (const error of refused) {
        expect((error as Error).message).toStartWith('READONLY ')
        expect(isRedisUnavailable(error)).toBe(true)
      }
      await until(async () => (await set(redis, ['written'], ['after']).catch(() => null)) === 'after', 10_000)
      expect(await reader.get('written')).toBe('after')
    } finally {
      redis.disconnect()
      await close()
    }
  }, 15_000)
})

describe('REDIS_URL naming a database', () => {
  test('one the server refuses stops the boot with one line, rather than going on in database 0', async () => {
    const refused = createRedis(
      `${server.url}/99`,
      createLog('error', () => {}),
      'commands',
    )
    const error = await connectRedis(refused, `${server.url}/99`).catch((e: Error) => e)
    expect((error as Error).message).toBe(`REDIS_URL=${server.url}/99 names database 99, which that Redis refuses: ERR DB index is out of range`)
    const chosen = createRedis(
      `${server.url}/3`,
      createLog('error', () => {}),
      'commands',
    )
    const reader = new Redis(`${server.url}/3`)
    try {
      await connectRedis(chosen, `${server.url}/3`)
      await chosen.set('database-three', 'here')
      expect(await reader.get('database-three')).toBe('here')
    } finally {
      chosen.disconnect()
      reader.disconnect()
    }
  })
})

describe('REDIS_URL asking TLS of a Redis without it', () => {
  test('stops the boot with one line saying so, not only that the connection timed out', async () => {
    const url = server.url.replace(/^redis:/, 'rediss:')
    const redis = createRedis(
      url,
      createLog('error', () => {}),
      'commands',
    )
    const error = await connectRedis(redis, url).catch((e: Error) => e)
    expect((error as Error).message).toStartWith(`Redis is not reachable at REDIS_URL=${url} (`)
    expect((error as Error).message).toContain('rediss:// speaks TLS, which a Redis without TLS on that port never answers (use redis:// for it)')
  }, 30_000)
})

describe('a Redis whose password changed under the service', () => {
  test('requests that need it are 503 unavailable, not 500, until it takes the service’s password again', async () => {
    const own = await startRedisServer()
    const setup = new Redis(own.url)
    await setup.config('SET', 'requirepass', 'before')
    setup.disconnect()
    const url = own.url.replace('redis://', 'redis://:before@')
    const protectedCtx = await createTestContext({ env: { REDIS_URL: url } })
    const admin = new Redis(own.url, { password: 'before' })
    try {
      const user = await signUp(protectedCtx)
      // Rotated away without the service (the old password gone), every connection closed.
      await admin.config('SET', 'requirepass', 'after')
      await admin.auth('after')
      await admin.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
      await admin.client('KILL', 'TYPE', 'pubsub')
      const answers = [
        await protectedCtx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'locked out' } }),
        await protectedCtx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'locked out' } }),
      ]
      for (const answer of answers) expectError(answer, 503, 'unavailable')
      await admin.config('SET', 'requirepass', 'before')
      await until(
        async () => (await protectedCtx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'back' } })).status === 201,
        20_000,
      )
    } finally {
      admin.disconnect()
      await protectedCtx.close()
      await own.close()
    }
  }, 40_000)
})
