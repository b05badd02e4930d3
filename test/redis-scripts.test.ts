/** Batched scripts: the calls of one tick share an EVALSHA, each caller still gets its own result. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { defineBatchedScript } from '../src/redis.ts'
import { startRedisCluster } from './helpers/redis-cluster.ts'
import calculateSlot from 'cluster-key-slot'

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(() => ctx.close())

// K a counter; A a step. Adds the step and answers with the new value and how many calls shared the EVALSHA.
const add = defineBatchedScript(`return { redis.call('INCRBY', K[1], A[1]), #KEYS }`, 1, 1, 4)

// A nil answer comes back as null, not as the end of the reply.
const nothing = defineBatchedScript(`if A[1] == 'none' then return nil end return A[1]`, 0, 1)

const key = (name: string) => `${ctx.deps.keys.prefix}batched:${name}`

describe('a batched script', () => {
  test('runs the calls of one tick together, at most maxCalls an EVALSHA, each caller getting its own result in call order', async () => {
    const counter = key(crypto.randomUUID())
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => add(ctx.deps.redis, [counter], [i + 1])))
    // 1 + 2 + … in call order, in EVALSHAs of 4, 4 and 2 calls.
    let total = 0
    expect(results).toEqual(Array.from({ length: 10 }, (_, i) => [(total += i + 1), i < 8 ? 4 : 2]))
    expect(await ctx.deps.redis.get(counter)).toBe('55')

    // Calls of different ticks go alone.
    const first = await add(ctx.deps.redis, [counter], [1])
    const second = await add(ctx.deps.redis, [counter], [1])
    expect([first, second]).toEqual([
      [56, 1],
      [57, 1],
    ])
  })

  test('calls on different connections are not mixed', async () => {
    const other = ctx.deps.redis.duplicate()
    try {
      const counter = key(crypto.randomUUID())
      const results = await Promise.all([add(ctx.deps.redis, [counter], [1]), add(other, [counter], [1]), add(ctx.deps.redis, [counter], [1])])
      expect(results.map(r => (r as number[])[1])).toEqual([2, 1, 2])
      expect(await ctx.deps.redis.get(counter)).toBe('3')
    } finally {
      other.disconnect()
    }
  })

  test('on a real Redis Cluster calls go together only with calls whose keys share their slot', async () => {
    const cluster = await startRedisCluster()
    try {
      const client = await cluster.client()
      // Random tags on three slots (drawn again in the rare case two share one): one EVALSHA holding
      // keys of two slots would be refused (CROSSSLOT).
      let keys: string[]
      do {
        const tag = crypto.randomUUID()
        keys = [`{${tag}}:one`, `{other-${tag}}:two`, `{${tag}}:three`, `{third-${tag}}:four`]
      } while (new Set(keys.map(k => calculateSlot(k))).size !== 3)
      const results = await Promise.all(keys.map(k => add(client, [k], [1])))
      // The two calls of one tag shared an EVALSHA; each other call went alone, to its own slot's node.
      expect(results.map(r => (r as number[])[1])).toEqual([2, 1, 2, 1])
      expect(await Promise.all(keys.map(k => client.get(k)))).toEqual(['1', '1', '1', '1'])
    } finally {
      await cluster.close()
    }
  }, 30_000)

  test('a call that raises an error fails alone, keeping what it did before; the other calls of its EVALSHA succeed', async () => {
    const counter = key(crypto.randomUUID())
    const notANumber = key(crypto.randomUUID())
    await ctx.deps.redis.set(notANumber, 'text')
    const settled = await Promise.allSettled([
      add(ctx.deps.redis, [counter], [1]),
      add(ctx.deps.redis, [notANumber], [1]),
      add(ctx.deps.redis, [counter], [1]),
    ])
    expect(settled.map(s => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled'])
    expect(((settled[1] as PromiseRejectedResult).reason as Error).message).toContain('not an integer')
    expect(settled.map(s => (s.status === 'fulfilled' ? s.value : null))).toEqual([[1, 3], null, [2, 3]])

    expect(await Promise.all(['a', 'none', 'b'].map(arg => nothing(ctx.deps.redis, [], [arg])))).toEqual(['a', null, 'b'])
  })

  test('an EVALSHA that cannot be sent fails each of its calls; a call with the wrong shape is refused alone', async () => {
    const closing = ctx.deps.redis.duplicate()
    await closing.ping()
    const counter = key(crypto.randomUUID())
    const calls = [add(closing, [counter], [1]), add(closing, [counter], [1])]
    closing.disconnect()
    expect((await Promise.allSettled(calls)).map(s => s.status)).toEqual(['rejected', 'rejected'])
    expect(await ctx.deps.redis.get(counter)).toBeNull()

    await expect(add(ctx.deps.redis, [counter, counter], [1])).rejects.toThrow('takes 1 keys and 1 arguments a call')
    await expect(add(ctx.deps.redis, [counter], [])).rejects.toThrow('takes 1 keys and 1 arguments a call')
  })
})
