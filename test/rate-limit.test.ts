/** The token buckets in Redis: taking, checking and giving back. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { AppError } from '../src/errors.ts'

let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext({ env: { RATE_LIMITS: JSON.stringify({ chatPost: { capacity: 2, perSeconds: 3600 } }) } })
})
afterAll(() => ctx.close())

const refused = (promise: Promise<void>) =>
  promise.then(
    () => null,
    (error: unknown) => (error instanceof AppError ? error.code : String(error)),
  )

describe('a token bucket', () => {
  test('takes up to its capacity, then refuses; a token given back can be taken again, never beyond the capacity', async () => {
    const { rateLimiter } = ctx.deps
    const subject = `test:${crypto.randomUUID()}`
    await rateLimiter.take('chatPost', subject)
    await rateLimiter.take('chatPost', subject)
    expect(await refused(rateLimiter.take('chatPost', subject))).toBe('rate_limited')
    expect(await refused(rateLimiter.check('chatPost', subject))).toBe('rate_limited')
    await rateLimiter.refund('chatPost', subject)
    expect(await refused(rateLimiter.check('chatPost', subject))).toBeNull()
    await rateLimiter.take('chatPost', subject)
    expect(await refused(rateLimiter.take('chatPost', subject))).toBe('rate_limited')

    // Giving back more than was taken fills the bucket and no more.
    const other = `test:${crypto.randomUUID()}`
    for (let i = 0; i < 5; i++) await rateLimiter.refund('chatPost', other)
    await rateLimiter.take('chatPost', other)
    await rateLimiter.take('chatPost', other)
    expect(await refused(rateLimiter.take('chatPost', other))).toBe('rate_limited')
  })
})
