/**
 * The wall clock stepped back (NTP correcting a host, a VM resumed from a snapshot): what a process
 * keeps in memory for a time, or holds back for a time, keeps to that time, by the monotonic clock.
 */
import { afterAll, afterEach, beforeAll, expect, setSystemTime, test } from 'bun:test'
import { hashKeyHex } from '../src/auth/api-key.ts'
import { createKeyCache } from '../src/auth/key-cache.ts'
import { createUnknownKeyLimit } from '../src/auth/unknown-keys.ts'
import { createRateLimiter } from '../src/rate-limit/token-bucket.ts'
import { createInboxReader } from '../src/conversations/inbox-reader.ts'
import { createLog, throttled } from '../src/log.ts'
import { until } from './helpers/until.ts'
import { createAgent, createTestContext, signUp, type TestContext } from './helpers/context.ts'

const hourMs = 3_600_000
let ctx: TestContext

beforeAll(async () => {
  ctx = await createTestContext()
})
afterAll(async () => {
  await ctx.close()
})
// Back to the real clock.
afterEach(() => void setSystemTime())

test('an API key revoked behind the cache’s back is refused once its entry’s time is up, the clock an hour back meanwhile', async () => {
  const { sql, redis, pubsub, keys, clock, log, database } = ctx.deps
  const cache = await createKeyCache({ sql, redis, pubsub, channel: `${keys.channels.keyRevoked}:clock`, clock, log, database, ttlMs: 200 })
  try {
    const agent = await createAgent(ctx, await signUp(ctx))
    const hex = hashKeyHex(agent.apiKey)
    expect(await cache.lookup(hex)).toMatchObject({ kind: 'agent', participantId: agent.id })
    // Revoked with no announcement (a lost one): only the entry's time bounds how long it is served.
    await sql`update api_keys set revoked_at = now() where participant_id = ${agent.id}`
    setSystemTime(new Date(Date.now() - hourMs))
    await Bun.sleep(300)
    expect(cache.peek(hex)).toBeUndefined()
    expect(await cache.lookup(hex)).toBe('revoked')
  } finally {
    await cache.close()
  }
})

test('an agent’s inbox is read from Redis again once its copy in memory is due, the clock an hour back meanwhile', async () => {
  const reader = await createInboxReader({ ...ctx.deps, ttlMs: 200 })
  try {
    const agent = await createAgent(ctx, await signUp(ctx))
    // The first read builds the inbox; the second reads it from Redis and keeps a copy.
    await reader.read(agent.id)
    await reader.read(agent.id)
    expect(reader.peek(agent.id)).toBeDefined()
    setSystemTime(new Date(Date.now() - hourMs))
    await Bun.sleep(300)
    expect(reader.peek(agent.id)).toBeUndefined()
  } finally {
    await reader.close()
  }
})

test('an address refused unknown API keys is let through once the window has passed, the clock an hour back meanwhile', async () => {
  const { redis, keys, clock, config, log } = ctx.deps
  // One unknown key a second: the second within it empties the bucket.
  const rule = { capacity: 1, perSeconds: 1 }
  const limit = createUnknownKeyLimit(createRateLimiter(redis, keys, clock, { ...config.rateLimits, apiKeyMisses: rule }), rule, clock, log)
  const subject = `ip:clock-${Math.random()}`
  limit.missed(subject)
  limit.missed(subject)
  await until(async () => {
    try {
      limit.admit(subject)
      return false
    } catch {
      return true
    }
  }, 5000)
  setSystemTime(new Date(Date.now() - hourMs))
  await Bun.sleep(1100)
  expect(() => limit.admit(subject)).not.toThrow()
})

test('a throttled log writes again once its window has passed, the clock an hour back meanwhile', async () => {
  const lines: string[] = []
  const write = throttled(
    createLog('info', line => lines.push(line)),
    100,
  )
  write('warn', 'down', 'still down')
  setSystemTime(new Date(Date.now() - hourMs))
  await Bun.sleep(150)
  write('warn', 'down', 'still down')
  expect(lines).toHaveLength(2)
})
