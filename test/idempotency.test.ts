/** Idempotency-Key reservations for commands and upstream calls: take-overs and late finishers. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { until } from './helpers/until.ts'
import { createTestContext, expectError, signUp, type TestContext } from './helpers/context.ts'
import { idempotent, idempotentCommand, type CommandOptions } from '../src/idempotency/idempotent.ts'
import { renderError } from '../src/http/error-handler.ts'
import { AppError } from '../src/errors.ts'
import { errors } from '../src/errors.ts'
import { createSql } from '../src/db.ts'
import { createLog } from '../src/log.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(() => ctx.close())

/** A pool of two connections to this test's database through a proxy the test can hold or stop. */
async function throughHeldProxy() {
  const proxy = await startHeldProxy(ctx.config.databaseUrl!)
  const through = new URL(ctx.config.databaseUrl!)
  through.port = new URL(proxy.url).port
  return { proxy, sql: createSql(through.toString(), { max: 2 }) }
}

const upstreamLike: CommandOptions = { leaseMs: 10_000 }
const request = (key: string) => ({ subject: 'test:caller', key, method: 'POST', path: '/v1/agent/proxy-call', body: { n: 1 } })

/** A call that holds its reservation until released, then answers (or throws) as `finish` does. */
function heldCall(key: string, finish: () => { status: number; body: unknown }) {
  let release!: () => void
  const gate = new Promise<void>(resolve => (release = resolve))
  const ids: string[] = []
  const done = idempotentCommand(
    ctx.deps,
    request(key),
    async ({ commandId }) => {
      ids.push(commandId!)
      await gate
      return finish()
    },
    upstreamLike,
  )
  return { done, release, ids }
}

describe('a reservation taken over', () => {
  test('keeps its command id, and the original finishing late changes nothing', async () => {
    ctx.clock.freeze(new Date())
    try {
      const a = heldCall('late-finisher', () => ({ status: 200, body: 'by A' }))
      await until(async () => a.ids.length > 0)
      // Within its lease the original still holds it.
      await expect(
        idempotentCommand(ctx.deps, request('late-finisher'), async () => ({ status: 200, body: 'x' }), upstreamLike),
      ).rejects.toMatchObject({
        code: 'idempotency_key_in_progress',
      })
      // The clock jumps past the lease before the original renews it: as if it had stalled.
      ctx.clock.advance(11_000)
      const takerIds: string[] = []
      const b = await idempotentCommand(
        ctx.deps,
        request('late-finisher'),
        async ({ commandId }) => {
          takerIds.push(commandId!)
          return { status: 200, body: 'by B' }
        },
        upstreamLike,
      )
      expect(b).toEqual({ status: 200, body: 'by B', replayed: false })
      expect(takerIds).toEqual(a.ids)
      a.release()
      expect((await a.done).body).toBe('by A')
      const replay = await idempotentCommand(ctx.deps, request('late-finisher'), async () => ({ status: 500, body: 'ran again' }), upstreamLike)
      expect(replay).toEqual({ status: 200, body: 'by B', replayed: true })
    } finally {
      ctx.clock.resume()
    }
  })

  test('the original failing late does not free the key under the taker', async () => {
    ctx.clock.freeze(new Date())
    try {
      const a = heldCall('late-failure', () => {
        throw errors.upstreamUnreachable()
      })
      await until(async () => a.ids.length > 0)
      ctx.clock.advance(11_000)
      const b = heldCall('late-failure', () => ({ status: 200, body: 'by B' }))
      await until(async () => b.ids.length > 0)
      a.release()
      await expect(a.done).rejects.toMatchObject({ code: 'upstream_unreachable' })
      // The taker's reservation is still there: a third caller is told it is in progress.
      await expect(
        idempotentCommand(ctx.deps, request('late-failure'), async () => ({ status: 200, body: 'by C' }), upstreamLike),
      ).rejects.toMatchObject({
        code: 'idempotency_key_in_progress',
      })
      b.release()
      expect((await b.done).body).toBe('by B')
    } finally {
      ctx.clock.resume()
    }
  })
})

describe('a leased request that failed with 5xx', () => {
  test('leaves its reservation for the retry, which takes it over at once with the same command id', async () => {
    const ids: string[] = []
    const first = idempotentCommand(
      ctx.deps,
      request('metered-then-failed'),
      async identity => {
        ids.push(identity.commandId!)
        throw errors.unavailable()
      },
      upstreamLike,
    )
    await expect(first).rejects.toMatchObject({ code: 'unavailable' })
    const retry = await idempotentCommand(
      ctx.deps,
      request('metered-then-failed'),
      async identity => {
        ids.push(identity.commandId!)
        return { status: 200, body: 'done' }
      },
      upstreamLike,
    )
    expect(retry).toEqual({ status: 200, body: 'done', replayed: false })
    // The same id both times: a usage event derived from it is counted once.
    expect(ids).toHaveLength(2)
    expect(ids[1]).toBe(ids[0])
  })

  test('a 4xx still frees the key, for a corrected request', async () => {
    const refused = idempotentCommand(
      ctx.deps,
      request('refused-then-corrected'),
      async () => {
        throw errors.notSubscribed()
      },
      upstreamLike,
    )
    await expect(refused).rejects.toMatchObject({ code: 'not_subscribed' })
    const corrected = { ...request('refused-then-corrected'), body: { n: 2 } }
    expect(await idempotentCommand(ctx.deps, corrected, async () => ({ status: 200, body: 'ok' }), upstreamLike)).toMatchObject({ status: 200 })
  })
})

describe('a repeat while the first request still runs (CONTRACT.md §9)', () => {
  /** The 409 a repeat in flight gets: `idempotency_key_in_progress` with a Retry-After of whole seconds. */
  async function expectInProgress(run: Promise<unknown>, atMostSeconds: number) {
    const error = await run.then(
      () => null,
      (caught: unknown) => caught,
    )
    expect(error).toBeInstanceOf(AppError)
    expect(error).toMatchObject({ status: 409, code: 'idempotency_key_in_progress' })
    const retryAfter = Number((error as AppError).headers?.['retry-after'])
    expect(retryAfter).toBeGreaterThanOrEqual(1)
    expect(retryAfter).toBeLessThanOrEqual(atMostSeconds)
  }

  test('in one transaction: 409 in progress, no connection held waiting; then the replay, or a run after a rollback', async () => {
    const effects: string[] = []
    const held = (key: string, finish: () => { status: number; body: unknown }) => {
      let release!: () => void
      const gate = new Promise<void>(resolve => (release = resolve))
      let started!: () => void
      const running = new Promise<void>(resolve => (started = resolve))
      const done = idempotent(ctx.deps, request(key), async () => {
        started()
        await gate
        effects.push(key)
        return finish()
      })
      return { done, release, running }
    }
    const repeat = (key: string, body = 'by the repeat') =>
      idempotent(ctx.deps, request(key), async () => {
        effects.push(`${key} again`)
        return { status: 201, body }
      })

    const first = held('tx-in-flight', () => ({ status: 201, body: 'by the first' }))
    await first.running
    // The first's transaction is open: the repeat is told so at once, and runs nothing.
    await expectInProgress(repeat('tx-in-flight'), 1)
    first.release()
    expect(await first.done).toEqual({ status: 201, body: 'by the first', replayed: false })
    expect(await repeat('tx-in-flight')).toEqual({ status: 201, body: 'by the first', replayed: true })
    expect(effects).toEqual(['tx-in-flight'])

    // A first that rolled back stored nothing: the repeat runs.
    const failing = held('tx-rolled-back', () => {
      throw errors.unavailable()
    })
    await failing.running
    await expectInProgress(repeat('tx-rolled-back'), 1)
    failing.release()
    await expect(failing.done).rejects.toMatchObject({ code: 'unavailable' })
    expect(await repeat('tx-rolled-back', 'ran')).toEqual({ status: 201, body: 'ran', replayed: false })
    expect(effects).toEqual(['tx-in-flight', 'tx-rolled-back', 'tx-rolled-back again'])
  })

  test('for an actor command: 409 in progress with the lease’s seconds, nothing sent; then the replay', async () => {
    const key = 'command-in-flight'
    const ids: string[] = []
    let answer!: () => void
    const answered = new Promise<void>(resolve => (answer = resolve))
    const first = idempotentCommand(ctx.deps, request(key), async ({ commandId }) => {
      ids.push(commandId!)
      await answered
      return { status: 201, body: 'applied once' }
    })
    await until(async () => ids.length === 1)
    const repeat = () =>
      idempotentCommand(ctx.deps, request(key), async ({ commandId }) => {
        ids.push(commandId!)
        return { status: 201, body: 'sent again' }
      })
    await expectInProgress(repeat(), 10)
    expect(ids).toHaveLength(1)
    answer()
    expect(await first).toEqual({ status: 201, body: 'applied once', replayed: false })
    expect(await repeat()).toEqual({ status: 201, body: 'applied once', replayed: true })
    expect(ids).toHaveLength(1)
  })
})

describe('a command whose answer never came (5xx), retried', () => {
  test('keeps the key when the retry is refused (4xx): the next retry takes over with the same command id', async () => {
    const key = 'unanswered-then-refused'
    const ids: string[] = []
    // The first may have been applied (its ask ran out): the key stays, its lease let go.
    const first = idempotentCommand(ctx.deps, request(key), async ({ commandId }) => {
      ids.push(commandId!)
      throw errors.unavailable()
    })
    await expect(first).rejects.toMatchObject({ code: 'unavailable' })
    // The retry takes it over, and is refused by its own checks: the first's command may still be
    // applied under the key, so the key is not freed for a new command id.
    const refused = idempotentCommand(ctx.deps, request(key), async ({ commandId }) => {
      ids.push(commandId!)
      throw errors.rateLimited(1)
    })
    await expect(refused).rejects.toMatchObject({ code: 'rate_limited' })
    const again = await idempotentCommand(ctx.deps, request(key), async ({ commandId }) => {
      ids.push(commandId!)
      return { status: 201, body: 'applied once' }
    })
    expect(again).toEqual({ status: 201, body: 'applied once', replayed: false })
    expect(ids).toHaveLength(3)
    expect(new Set(ids).size).toBe(1)
  })

  test('gives a reply the same message time on every attempt: the reservation’s, not the take-over’s', async () => {
    const key = 'reply-taken-over'
    const seen: Date[] = []
    ctx.clock.freeze(new Date())
    try {
      await expect(
        idempotentCommand(ctx.deps, request(key), async ({ reservedAt }) => {
          seen.push(reservedAt!)
          throw errors.unavailable()
        }),
      ).rejects.toMatchObject({ code: 'unavailable' })
      ctx.clock.advance(60_000)
      await idempotentCommand(ctx.deps, request(key), async ({ reservedAt }) => {
        seen.push(reservedAt!)
        return { status: 201, body: 'stored once' }
      })
      expect(seen).toHaveLength(2)
      expect(seen[1]!.getTime()).toBe(seen[0]!.getTime())
    } finally {
      ctx.clock.resume()
    }
  })
})

describe('a reservation the previous release made (a UUIDv4, its time never renewed), taken over', () => {
  test('gives a reply the time that release gave it, on every take-over', async () => {
    const key = 'reply-of-the-previous-release'
    const seen: Date[] = []
    ctx.clock.freeze(new Date())
    try {
      await expect(
        idempotentCommand(ctx.deps, request(key), async () => {
          throw errors.unavailable()
        }),
      ).rejects.toMatchObject({ code: 'unavailable' })
      // As the previous release left a reply whose answer never came: a random id, and the time it was
      // made, which it passed as the reply's time (its repeats joined the reservation without moving it).
      const madeAt = ctx.clock.now()
      await ctx.deps.sql`
        update idempotency_keys set reservation = ${crypto.randomUUID()}, created_at = ${madeAt}
        where subject = 'test:caller' and key = ${key}
      `
      ctx.clock.advance(60_000)
      await expect(
        idempotentCommand(ctx.deps, request(key), async ({ reservedAt }) => {
          seen.push(reservedAt!)
          throw errors.unavailable()
        }),
      ).rejects.toMatchObject({ code: 'unavailable' })
      // Its first request, still running on a process of that release, refused by its checks: it frees
      // the key only if nobody joined it (sql/00024), and the take-over, which sent the command, did.
      const [reservation] = await ctx.deps.sql<{ id: string }[]>`
        select reservation as id from idempotency_keys where subject = 'test:caller' and key = ${key}
      `
      await ctx.deps.sql`
        delete from idempotency_keys
        where subject = 'test:caller' and key = ${key} and response_status is null
          and created_at = any(${[madeAt.toISOString()]}::timestamptz[]) and reservation = ${reservation!.id} and not joined
      `
      ctx.clock.advance(60_000)
      await idempotentCommand(ctx.deps, request(key), async ({ reservedAt }) => {
        seen.push(reservedAt!)
        return { status: 201, body: 'stored once' }
      })
      // The message id derives from it: any other time would store the reply a second time.
      expect(seen.map(time => time.getTime())).toEqual([madeAt.getTime(), madeAt.getTime()])
    } finally {
      ctx.clock.resume()
    }
  })
})

describe('a lease whose renewal landed unanswered (the connection to PostgreSQL lost)', () => {
  test('is still the holder’s: its answer is stored, and a repeat after the lease replays it', async () => {
    const key = 'renewal-unanswered'
    const { proxy, sql } = await throughHeldProxy()
    const leaseMs = 900
    ctx.clock.freeze(new Date())
    let ran = 0
    let finish!: () => void
    const finished = new Promise<void>(resolve => (finish = resolve))
    try {
      const first = idempotentCommand(
        { sql, clock: ctx.clock },
        request(key),
        async () => {
          ran++
          await finished
          return { status: 200, body: 'by the first' }
        },
        { leaseMs },
      )
      const renewed = async () => {
        ctx.clock.advance(100)
        const at = ctx.clock.now().getTime()
        await until(async () => {
          const [row] = await ctx.deps.sql<{ at: Date }[]>`select created_at as at from idempotency_keys where key = ${key}`
          return row?.at.getTime() === at
        })
      }
      await until(async () => ran === 1)
      await renewed()
      // PostgreSQL's answers are held back: the next renewal is made, and its answer never arrives.
      proxy.delay({ toServer: 0, toClient: 60_000 })
      await renewed()
      await proxy.stop()
      proxy.delay({ toServer: 0, toClient: 0 })
      await proxy.restart()
      finish()
      expect(await first).toEqual({ status: 200, body: 'by the first', replayed: false })
      ctx.clock.advance(leaseMs + 1000)
      const repeat = await idempotentCommand(
        ctx.deps,
        request(key),
        async () => {
          ran++
          return { status: 200, body: 'by the repeat' }
        },
        { leaseMs },
      )
      expect(repeat).toEqual({ status: 200, body: 'by the first', replayed: true })
      expect(ran).toBe(1)
    } finally {
      ctx.clock.resume()
      await sql.end({ timeout: 0 })
      await proxy.close()
    }
  })
})

describe('a leased request whose end could not be written (PostgreSQL away)', () => {
  /**
   * Runs a call through a connection to PostgreSQL that goes away while the call runs and comes back
   * after it failed; the clock stands still, so the lease never lapses by itself. Returns the repeat's
   * answer once it is not refused as in progress, and how many times the call's work ran.
   */
  async function cutOffWhileRunning(key: string, finish: () => { status: number; body: unknown }) {
    const { proxy, sql } = await throughHeldProxy()
    ctx.clock.freeze(new Date())
    let ran = 0
    try {
      const first = idempotentCommand(
        { sql, clock: ctx.clock },
        request(key),
        async () => {
          ran++
          await proxy.stop()
          return finish()
        },
        upstreamLike,
      )
      await expect(first).rejects.toThrow()
      await proxy.restart()
      let repeat: Awaited<ReturnType<typeof idempotentCommand>> | undefined
      await until(async () => {
        repeat = await idempotentCommand(
          ctx.deps,
          request(key),
          async () => {
            ran++
            return { status: 200, body: 'by the repeat' }
          },
          upstreamLike,
        ).catch(error => {
          if (error?.code === 'idempotency_key_in_progress') return undefined
          throw error
        })
        return repeat !== undefined
      }, 5000)
      return { repeat, ran }
    } finally {
      ctx.clock.resume()
      await sql.end()
      await proxy.close()
    }
  }

  test('an answer is stored once PostgreSQL is back: the repeat replays it, the work not run again', async () => {
    const { repeat, ran } = await cutOffWhileRunning('answered-while-away', () => ({ status: 200, body: 'by the first' }))
    expect(repeat).toEqual({ status: 200, body: 'by the first', replayed: true })
    expect(ran).toBe(1)
  })

  test('a 5xx lets the lease go once PostgreSQL is back: the repeat takes over at once', async () => {
    const { repeat, ran } = await cutOffWhileRunning('failed-while-away', () => {
      throw errors.unavailable()
    })
    expect(repeat).toEqual({ status: 200, body: 'by the repeat', replayed: false })
    expect(ran).toBe(2)
  })

  test('a 4xx frees the key once PostgreSQL is back: the repeat runs', async () => {
    const { repeat, ran } = await cutOffWhileRunning('refused-while-away', () => {
      throw errors.notSubscribed()
    })
    expect(repeat).toEqual({ status: 200, body: 'by the repeat', replayed: false })
    expect(ran).toBe(2)
  })

  test('an end still unwritten when the lease lapses is logged: a repeat may run the call again', async () => {
    const { proxy, sql } = await throughHeldProxy()
    const lines: Record<string, unknown>[] = []
    const log = createLog('info', line => lines.push(JSON.parse(line)))
    const given = (msg: string) => lines.find(line => line.msg === msg)
    try {
      const first = idempotentCommand(
        { sql, clock: ctx.clock, log },
        request('away-past-lease'),
        async () => {
          await proxy.stop()
          return { status: 200, body: 'by the first' }
        },
        { leaseMs: 300 },
      )
      await expect(first).rejects.toThrow()
      const warned = 'an Idempotency-Key’s outcome could not be stored within its lease; a repeat may run the call again'
      await until(async () => given(warned) !== undefined, 5000)
      expect(given(warned)).toMatchObject({ level: 'warn', subject: 'test:caller', key: 'away-past-lease' })
    } finally {
      await sql.end({ timeout: 0 })
      await proxy.close()
    }
  })
})

describe('a bad key', () => {
  // Empty (or only spaces, which header parsing trims away) and too long are refused alike, wherever
  // it is caught: by the route's header schema or by the module itself (a caller that skips it).
  const expected = {
    success: false,
    statusCode: 400,
    error: 'validation_failed',
    message: 'The headers are not valid: /idempotency-key must be 1 to 255 characters',
    details: [{ path: '/idempotency-key', message: 'must be 1 to 255 characters' }],
  }

  test('is 400 in the envelope with the contract’s rule, never the validator’s wording', async () => {
    const user = await signUp(ctx)
    for (const key of ['', '   ', 'k'.repeat(256)]) {
      const refused = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'hi' }, headers: { 'idempotency-key': key } })
      expectError(refused, 400, 'validation_failed')
      expect(refused.body, `${key.length} characters`).toEqual(expected)
    }
    // The contract asks 1 to 255 characters, of any kind a header can carry.
    for (const key of ['k'.repeat(255), 'a key, with spaces; é']) {
      const taken = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'hi' }, headers: { 'idempotency-key': key } })
      expect(taken.status, key).toBe(201)
    }
  })

  test('is refused by the module with the same answer', async () => {
    for (const key of ['', 'k'.repeat(256)]) {
      const run = idempotent(ctx.deps, { ...request(key), key }, async () => ({ status: 200, body: 'ran' }))
      const error = await run.then(
        () => null,
        (caught: unknown) => caught,
      )
      expect(error).toBeInstanceOf(AppError)
      expect(await renderError(error as AppError).json()).toEqual(expected)
    }
  })
})
