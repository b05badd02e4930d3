/** Idempotency-Key reservations for commands and upstream calls: take-overs and late finishers. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { idempotentCommand, type CommandOptions } from '../src/idempotency/idempotent.ts'
import { errors } from '../src/errors.ts'

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(() => ctx.close())

const upstreamLike: CommandOptions = { inFlight: 'refuse', takeOverAfterMs: 60_000 }
const request = (key: string) => ({ subject: 'test:caller', key, method: 'POST', path: '/v1/agent/proxy-call', body: { n: 1 } })

/** A call that holds its reservation until released. */
function heldCall(key: string, answer: string) {
  let release!: () => void
  const gate = new Promise<void>(resolve => (release = resolve))
  const ids: string[] = []
  const done = idempotentCommand(
    ctx.deps,
    request(key),
    async ({ commandId }) => {
      ids.push(commandId!)
      await gate
      return { status: 200, body: answer }
    },
    upstreamLike,
  )
  return { done, release, ids }
}

describe('a reservation taken over', () => {
  test('keeps its command id, and the original finishing late changes nothing', async () => {
    ctx.clock.freeze(new Date())
    try {
      const a = heldCall('late-finisher', 'by A')
      await Bun.sleep(50)
      // Within the minute the original still holds it.
      await expect(idempotentCommand(ctx.deps, request('late-finisher'), async () => ({ status: 200, body: 'x' }), upstreamLike)).rejects.toMatchObject({
        code: 'idempotency_key_reused',
      })
      ctx.clock.advance(61_000)
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
      let release!: () => void
      const gate = new Promise<void>(resolve => (release = resolve))
      const a = idempotentCommand(
        ctx.deps,
        request('late-failure'),
        async () => {
          await gate
          throw errors.upstreamUnreachable()
        },
        upstreamLike,
      )
      await Bun.sleep(50)
      ctx.clock.advance(61_000)
      let releaseTaker!: () => void
      const takerGate = new Promise<void>(resolve => (releaseTaker = resolve))
      const b = idempotentCommand(
        ctx.deps,
        request('late-failure'),
        async () => {
          await takerGate
          return { status: 200, body: 'by B' }
        },
        upstreamLike,
      )
      await Bun.sleep(50)
      release()
      await expect(a).rejects.toMatchObject({ code: 'upstream_unreachable' })
      // The taker's reservation is still there: a third caller is told it is in progress.
      await expect(idempotentCommand(ctx.deps, request('late-failure'), async () => ({ status: 200, body: 'by C' }), upstreamLike)).rejects.toMatchObject({
        code: 'idempotency_key_reused',
      })
      releaseTaker()
      expect((await b).body).toBe('by B')
    } finally {
      ctx.clock.resume()
    }
  })
})
