/**
 * What a loop of stream opens can make the service read and send: each resume from far back
 * (`Last-Event-ID: 0-0`) replays up to the 1,000 events its stream keeps, so the events replayed
 * are counted per user (`streamReplay`) and per chat client address (`chatReplay`), and a resume
 * past the budget is 429 before anything is read. Opens that replay nothing are not refused.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createTestContext, signUp, testRateLimits, type TestContext } from './helpers/context.ts'
import { streamLength } from '../src/events/relay.ts'

const budget = 1500
let ctx: TestContext
let server: ReturnType<TestContext['app']['listen']>
let base: string

beforeAll(async () => {
  ctx = await createTestContext({
    env: {
      TRUSTED_PROXIES: '127.0.0.1',
      RATE_LIMITS: JSON.stringify({
        ...testRateLimits,
        streamReplay: { capacity: budget, perSeconds: 3600 },
        chatReplay: { capacity: budget, perSeconds: 3600 },
      }),
    },
  })
  server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  base = `http://127.0.0.1:${server.server!.port}`
})
afterAll(async () => {
  await server.stop()
  await ctx.close()
})

/** Fills a stream with the most it keeps; the ids added, oldest first. */
async function fill(stream: string): Promise<string[]> {
  const adds = ctx.deps.redis.pipeline()
  for (let n = 0; n < streamLength; n++) adds.xadd(stream, '*', 'type', 'chat.message', 'data', JSON.stringify({ type: 'chat.message', n }))
  return (await adds.exec())!.map(([, id]) => id as string)
}

/**
 * Opens a stream; when it is 200, reads it until `last` arrives and closes it. The status, and the
 * events it replayed (an `events.missed` notice before them is not one).
 */
async function open(path: string, headers: Record<string, string>, last: string) {
  const response = await fetch(`${base}${path}`, { headers })
  if (response.status !== 200) return { status: response.status, response, events: 0 }
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  while (!text.includes(`id: ${last}\n`) && !/id: \d+-\d+\n\n/.test(text)) {
    const { value, done } = await reader.read()
    if (done) break
    text += decoder.decode(value)
  }
  await reader.cancel()
  return { status: 200, response, events: (text.match(/\nevent: (?!events\.missed\n)/g) ?? []).length }
}

/** Opens the stream `times` times one after another; what each was answered, and every event sent in all. */
async function loop(path: string, headers: Record<string, string>, last: string, times: number) {
  const statuses: number[] = []
  let events = 0
  let refused: Response | undefined
  for (let n = 0; n < times; n++) {
    const result = await open(path, headers, last)
    statuses.push(result.status)
    events += result.events
    if (result.status !== 200) refused = result.response
  }
  return { statuses, events, refused }
}

async function expectRateLimited(response: Response | undefined) {
  expect(response?.status).toBe(429)
  expect(((await response!.json()) as { error: string }).error).toBe('rate_limited')
  expect(Number(response!.headers.get('retry-after'))).toBeGreaterThan(0)
}

describe('resumes from far back, in a loop', () => {
  test('world chat (public): one address is replayed at most its budget and one replay more, then 429; others are not', async () => {
    const ids = await fill(ctx.deps.keys.events.chat)
    const last = ids.at(-1)!
    const address = { 'x-forwarded-for': '203.0.113.7', 'last-event-id': '0-0' }
    const { statuses, events, refused } = await loop('/v1/events/chat', address, last, 6)
    // The bound: what one address can make the service read and send, not 6,000 events.
    expect(events).toBeLessThanOrEqual(budget + streamLength)
    expect(statuses).toEqual([200, 200, 429, 429, 429, 429])
    await expectRateLimited(refused)
    // Opening afresh replays nothing, and is not refused; nor is another address.
    expect((await open('/v1/events/chat', { 'x-forwarded-for': '203.0.113.7' }, last)).status).toBe(200)
    expect((await open('/v1/events/chat', { ...address, 'x-forwarded-for': '203.0.113.8' }, last)).events).toBe(streamLength)
    // The budget refills with time: a resume is served again.
    ctx.clock.advance(3600_000)
    expect((await open('/v1/events/chat', address, last)).events).toBe(streamLength)
  }, 30_000)

  test('reconnects that missed little (EventSource every 3 s, every client after a restart) spend only what they are sent', async () => {
    const ids = await fill(ctx.deps.keys.events.chat)
    const last = ids.at(-1)!
    const client = { 'x-forwarded-for': '203.0.113.9', 'last-event-id': ids.at(-3)! }
    const reconnects = await loop('/v1/events/chat', client, last, 20)
    expect(reconnects.statuses).toEqual(reconnects.statuses.map(() => 200))
    expect(reconnects.events).toBe(40)
    // 40 of 1,500 spent: a whole replay is still served.
    expect((await open('/v1/events/chat', { ...client, 'last-event-id': '0-0' }, last)).events).toBe(streamLength)
  }, 30_000)

  test('notifications: one user is replayed at most the budget and one replay more, with a key or stream tokens', async () => {
    const user = await signUp(ctx)
    const ids = await fill(ctx.deps.keys.events.user(user.id))
    const last = ids.at(-1)!
    const bearer = { authorization: `Bearer ${user.token}`, 'last-event-id': '0-0' }
    const { statuses, events, refused } = await loop('/v1/events/stream', bearer, last, 4)
    expect(events).toBeLessThanOrEqual(budget + streamLength)
    expect(statuses).toEqual([200, 200, 429, 429])
    await expectRateLimited(refused)
    // A stream token is the same user's budget.
    const token = await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })
    const byToken = await open(`/v1/events/stream?token=${token.body.data.token}&lastEventId=0-0`, {}, last)
    expect(byToken.status).toBe(429)
    expect((await open('/v1/events/stream', { authorization: `Bearer ${user.token}` }, last)).status).toBe(200)
  }, 30_000)
})
