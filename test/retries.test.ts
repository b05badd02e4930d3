/** Background retries (src/retries.ts): work tried until it lands, merged by key, backing off, tried once more at close. */
import { afterEach, describe, expect, test } from 'bun:test'
import { createRetries } from '../src/retries.ts'
import { newerChange } from '../src/conversations/replies.ts'
import { until } from './helpers/until.ts'

/** A gate an attempt waits at, and whether one is waiting there. */
function gate() {
  let open!: () => void
  const opened = new Promise<void>(resolve => (open = resolve))
  return { open, opened }
}

// The delays the retries ask for, recorded while their timers fire at once (no test here waits on a
// clock: `until` sleeps with Bun.sleep, which does not go through setTimeout).
const realSetTimeout = globalThis.setTimeout
let delays: number[] = []
const recordDelays = () => {
  delays = []
  globalThis.setTimeout = ((callback: () => void, ms?: number) => {
    delays.push(ms ?? 0)
    return realSetTimeout(callback, 0)
  }) as typeof setTimeout
}
afterEach(() => {
  globalThis.setTimeout = realSetTimeout
})

describe('background retries', () => {
  test('try at once, back off while failing (doubling, capped), stop when the work lands, and start again at once', async () => {
    recordDelays()
    let failures = 5
    let landed = 0
    const retries = createRetries<string>({
      attempt: async () => {
        if (failures-- > 0) throw new Error('Connection is closed.')
        landed++
      },
      firstDelayMs: 20,
      maxDelayMs: 60,
    })
    retries.add('a', 'x')
    await until(async () => landed === 1)
    retries.add('b', 'y')
    await until(async () => landed === 2)
    expect(delays).toEqual([0, 20, 40, 60, 60, 60, 0])
    expect((await retries.close()).size).toBe(0)
  })

  test('with a first delay, wait it before the first attempt, and at least twice it after a failure', async () => {
    recordDelays()
    let failures = 2
    const retries = createRetries<string>({
      attempt: async () => {
        if (failures-- > 0) throw new Error('Connection is closed.')
      },
      initialDelayMs: 200,
      maxDelayMs: 5000,
    })
    retries.add('a', 'x')
    await until(async () => failures < 0)
    expect(delays).toEqual([200, 400, 800])
    await retries.close()
  })

  test('work added under a waiting key is merged with what waits (held first, then added) and tried once', async () => {
    const tried: string[] = []
    const retries = createRetries<string>({
      attempt: async value => void tried.push(value),
      merge: (held, added) => `${held}+${added}`,
      initialDelayMs: 30,
    })
    retries.add('k', 'a')
    retries.add('k', 'b')
    retries.add('k', 'c')
    await until(async () => tried.length === 1)
    await Bun.sleep(60)
    expect(tried).toEqual(['a+b+c'])
    await retries.close()
  })

  /** Retries whose first attempt waits at a gate, merging by the larger value. */
  const heldFirst = () => {
    const tried: string[] = []
    const first = gate()
    let started!: () => void
    const running = new Promise<void>(resolve => (started = resolve))
    const retries = createRetries<number>({
      attempt: async (value, key) => {
        tried.push(`${key}=${value}`)
        if (tried.length === 1) {
          started()
          await first.opened
        }
      },
      merge: (held, added) => Math.max(held, added),
    })
    return { retries, tried, running, open: first.open }
  }

  test('work added while its attempt runs is tried again after it', async () => {
    const { retries, tried, running, open } = heldFirst()
    retries.add('k', 1)
    await running
    retries.add('k', 2)
    open()
    await until(async () => tried.length === 2)
    expect(tried).toEqual(['k=1', 'k=2'])
    expect((await retries.close()).size).toBe(0)
    expect(tried).toHaveLength(2)
  })

  test('work merged into what an attempt is trying (the merge kept it) is not tried again', async () => {
    const { retries, tried, running, open } = heldFirst()
    retries.add('k', 5)
    await running
    retries.add('k', 3)
    open()
    await Bun.sleep(50)
    // Nothing left: close has nothing to try once more.
    expect((await retries.close()).size).toBe(0)
    expect(tried).toEqual(['k=5'])
  })

  test('a round tries the newest value of each key, added while earlier keys were tried', async () => {
    const tried: string[] = []
    const slow = gate()
    const retries = createRetries<string>({
      attempt: async (value, key) => {
        tried.push(`${key}=${value}`)
        if (key === 'a') await slow.opened
      },
    })
    retries.add('a', '1')
    retries.add('k', 'old')
    await until(async () => tried.length === 1)
    retries.add('k', 'new')
    slow.open()
    await until(async () => tried.length === 2)
    await Bun.sleep(50)
    expect(tried).toEqual(['a=1', 'k=new'])
    await retries.close()
  })

  test('close waits for an attempt under way, tries once more, returns what is left, and takes nothing after', async () => {
    let redisBack = false
    const tried: string[] = []
    const failedKeys: string[] = []
    let inFlight = 0
    let overlapped = false
    const held = gate()
    let holding = false
    const retries = createRetries<string>({
      attempt: async (_value, key) => {
        inFlight++
        overlapped ||= inFlight > 1
        tried.push(key)
        try {
          if (key === 'lands' && tried.length === 1) {
            holding = true
            await held.opened
          }
          if (key === 'stuck' || !redisBack) throw new Error('Connection is closed.')
        } finally {
          inFlight--
        }
      },
      failed: key => failedKeys.push(key),
      firstDelayMs: 10_000,
    })
    retries.add('lands', 'a')
    retries.add('stuck', 'b')
    await until(async () => holding)
    let closed = false
    const closing = retries.close().then(left => ((closed = true), left))
    const again = retries.close()
    await Bun.sleep(50)
    expect(closed).toBe(false)
    redisBack = true
    held.open()
    const left = await closing
    expect(await again).toBe(left)
    expect([...left]).toEqual([['stuck', 'b']])
    // The round under way ('lands' landed late, 'stuck' failed), then one more try of what was left.
    expect(tried).toEqual(['lands', 'stuck', 'stuck'])
    expect(failedKeys).toEqual(['stuck', 'stuck'])
    expect(overlapped).toBe(false)
    expect(retries.add('late', 'c')).toBe(false)
  })

  test('a failure that cannot be told does not stop the retries', async () => {
    let failures = 2
    const retries = createRetries<string>({
      attempt: async () => {
        if (failures-- > 0) throw new Error('Connection is closed.')
      },
      failed: () => {
        throw new Error('the log is broken')
      },
      firstDelayMs: 10,
    })
    retries.add('a', 'x')
    await until(async () => failures < 0)
    expect((await retries.close()).size).toBe(0)
  })
})

describe('a reply writer’s waiting inbox changes', () => {
  test('keep the newer removal of a conversation, whichever order they come in, and the latest rebuild', () => {
    const older = { agentId: 'a', userId: 'u', version: 3 }
    const newer = { agentId: 'a', userId: 'u', version: 5 }
    expect(newerChange(older, newer)).toBe(newer)
    expect(newerChange(newer, older)).toBe(newer)
    const rebuild = { agentId: 'a', invalidate: true as const }
    const again = { agentId: 'a', invalidate: true as const }
    expect(newerChange(rebuild, again)).toBe(again)
  })
})
