/** Background retries (src/retries.ts): work tried until it lands, merged by key, backing off, tried once more at close. */
import { describe, expect, test } from 'bun:test'
import { createRetries } from '../src/retries.ts'
import { until } from './helpers/until.ts'

describe('background retries', () => {
  test('try until the work lands, backing off between failed attempts, and stop trying what landed', async () => {
    const at: number[] = []
    let failures = 3
    const retries = createRetries<string>({
      attempt: async () => {
        at.push(performance.now())
        if (failures-- > 0) throw new Error('Connection is closed.')
      },
      firstDelayMs: 20,
      maxDelayMs: 60,
    })
    const started = performance.now()
    retries.add('a', 'x')
    await until(async () => at.length === 4)
    await Bun.sleep(150)
    expect(at).toHaveLength(4)
    // At once, then after 20, 40 and 60 ms (the cap): at least 120 ms in all.
    expect(at[3]! - started).toBeGreaterThanOrEqual(115)
    expect((await retries.close()).size).toBe(0)
  })

  test('work added under a waiting key is merged with it and tried once', async () => {
    const tried: number[] = []
    let open!: () => void
    const gate = new Promise<void>(resolve => (open = resolve))
    const retries = createRetries<number>({
      attempt: async value => {
        await gate
        tried.push(value)
      },
      merge: (held, added) => Math.max(held, added),
      initialDelayMs: 30,
    })
    retries.add('k', 3)
    retries.add('k', 7)
    retries.add('k', 5)
    open()
    await until(async () => tried.length === 1)
    await Bun.sleep(60)
    expect(tried).toEqual([7])
    await retries.close()
  })

  test('work added again while its attempt runs is tried again after it', async () => {
    const tried: string[] = []
    let open!: () => void
    const gate = new Promise<void>(resolve => (open = resolve))
    const retries = createRetries<string>({
      attempt: async value => {
        tried.push(value)
        if (value === 'first') await gate
      },
    })
    retries.add('k', 'first')
    await until(async () => tried.length === 1)
    retries.add('k', 'second')
    open()
    await until(async () => tried.length === 2)
    expect(tried).toEqual(['first', 'second'])
    expect((await retries.close()).size).toBe(0)
  })

  test('close tries once more, waits for an attempt under way, returns what is left, and takes nothing after', async () => {
    let redisBack = false
    const tried: string[] = []
    const failedKeys: string[] = []
    const retries = createRetries<string>({
      attempt: async (_value, key) => {
        tried.push(key)
        if (key === 'stuck' || !redisBack) throw new Error('Connection is closed.')
      },
      failed: key => failedKeys.push(key),
      firstDelayMs: 10_000,
    })
    retries.add('lands', 'a')
    retries.add('stuck', 'b')
    await until(async () => tried.length === 2)
    redisBack = true
    const left = await retries.close()
    expect([...left]).toEqual([['stuck', 'b']])
    expect(tried).toEqual(['lands', 'stuck', 'lands', 'stuck'])
    expect(failedKeys).toEqual(['lands', 'stuck', 'stuck'])
    expect(retries.add('late', 'c')).toBe(false)
  })
})
