/** A test's world: a fresh database, a random Redis prefix, the app, an adjustable clock, request helpers. */
import { randomBytes } from 'node:crypto'
import { SignJWT } from 'jose'
import { Redis } from 'ioredis'
import { loadConfig, type Config } from '../../src/config.ts'
import { createDeps, relayEffects, type Deps } from '../../src/deps.ts'
import { createApp, type App } from '../../src/app.ts'
import { adjustableClock } from '../../src/clock.ts'
import { createLog, type Log } from '../../src/log.ts'
import { deleteByPrefix } from '../../src/redis.ts'
import { createTestDatabase, type TestDatabase } from './database.ts'
import { startActors } from '../../workers/actors.ts'
import type { ActorRuntime } from '../../src/actors/runtime.ts'
import { startRelay, type Relay } from '../../src/events/relay.ts'

export const testJwtSecret = 'test-secret-that-is-at-least-32-characters-long'
export const redisUrl = process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'

export interface CallOptions {
  body?: unknown
  /** Sent as is, with content-type application/json unless headers say otherwise. */
  rawBody?: string
  token?: string
  apiKey?: string
  headers?: Record<string, string>
}

export interface CallResult {
  status: number
  headers: Headers
  // Tests read whatever came back; the assertions check its shape.
  body: any
}

export interface TestContext {
  config: Config
  deps: Deps
  app: App
  clock: ReturnType<typeof adjustableClock>
  database: TestDatabase
  /** The outbox relay the workers run, moving committed events to Redis (unless the test asked for none). */
  relay: Relay | undefined
  call(method: string, path: string, options?: CallOptions): Promise<CallResult>
  close(): Promise<void>
}

export function randomPrefix(): string {
  return `amtest:${randomBytes(6).toString('hex')}:`
}

/** The rate limits of every test context: generous, but for the rules left as they ship (RATE_LIMITS replaces them whole). */
export const testRateLimits: Record<string, { capacity: number; perSeconds: number }> = {
  deviceCodeCreate: { capacity: 10000, perSeconds: 1 },
  deviceCodePoll: { capacity: 10000, perSeconds: 1 },
  deviceCodeApprove: { capacity: 10000, perSeconds: 1 },
  apiKeyMisses: { capacity: 10000, perSeconds: 1 },
  apiKeyCreate: { capacity: 10000, perSeconds: 1 },
  participantCreate: { capacity: 10000, perSeconds: 1 },
  chatPost: { capacity: 10000, perSeconds: 1 },
  blogPostCreate: { capacity: 10000, perSeconds: 1 },
  blogContentEdit: { capacity: 10000, perSeconds: 1 },
  replyPost: { capacity: 10000, perSeconds: 1 },
  serviceRequestCreate: { capacity: 10000, perSeconds: 1 },
  messagePost: { capacity: 10000, perSeconds: 1 },
  proxyCall: { capacity: 10000, perSeconds: 1 },
  contextWrite: { capacity: 10000, perSeconds: 1 },
  connectionCreate: { capacity: 10000, perSeconds: 1 },
  planWrite: { capacity: 10000, perSeconds: 1 },
  configPurchase: { capacity: 10000, perSeconds: 1 },
  configWrite: { capacity: 10000, perSeconds: 1 },
  subscriptionCreate: { capacity: 10000, perSeconds: 1 },
  sseTokenCreate: { capacity: 10000, perSeconds: 1 },
  reviewWrite: { capacity: 10000, perSeconds: 1 },
  reactionWrite: { capacity: 10000, perSeconds: 1 },
  streamReplay: { capacity: 1_000_000, perSeconds: 1 },
  chatReplay: { capacity: 1_000_000, perSeconds: 1 },
}

/** Configuration for tests: every limit generous unless the test narrows it. */
export function testConfig(env: Record<string, string> = {}): Config {
  return loadConfig({
    NODE_ENV: 'test',
    REDIS_URL: redisUrl,
    REDIS_PREFIX: randomPrefix(),
    AUTH_JWT_SECRET: testJwtSecret,
    SITE_URL: 'http://test.local',
    CONNECTIONS_KEY: randomBytes(32).toString('hex'),
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'error',
    RATE_LIMITS: JSON.stringify(testRateLimits),
    PROXY_IN_FLIGHT_PER_AGENT: '10000',
    // A reservation, not memory in use: the most every proxy call might buffer.
    PROXY_BUFFER_BYTES: String(1024 ** 3),
    DATABASE_POOL_MAX: '5',
    ...env,
  })
}

export async function createTestContext(
  options: {
    env?: Record<string, string>
    database?: TestDatabase
    actors?: boolean
    relay?: boolean
    log?: Log
    renderTimeoutMs?: number
  } = {},
): Promise<TestContext> {
  const database = options.database ?? (await createTestDatabase())
  const config = { ...testConfig(options.env), databaseUrl: database.url }
  const clock = adjustableClock()
  const deps = await createDeps(config, { clock, log: options.log ?? createLog(config.logLevel), renderTimeoutMs: options.renderTimeoutMs })
  const app = createApp(deps)
  // The all-in-one process runs an actor runtime beside the API; tests that send commands do too.
  const runtime: ActorRuntime | undefined = options.actors ? await startActors(deps, { leaseMs: 2000 }) : undefined
  // So is the outbox relay, without which no event reaches a stream.
  const relay = options.relay === false ? undefined : startRelay({ ...deps, effects: relayEffects(deps) }, { everyMs: 20 })
  return {
    config,
    deps,
    app,
    clock,
    database,
    relay,
    call: (method, path, callOptions) => callApp(app, method, path, callOptions),
    async close() {
      await runtime?.stop()
      await relay?.stop()
      await deps.close()
      await deleteKeys(config.redisPrefix)
      if (!options.database) await database.drop()
    },
  }
}

export async function callApp(app: App, method: string, path: string, options: CallOptions = {}): Promise<CallResult> {
  const headers = new Headers(options.headers)
  if (options.token) headers.set('authorization', `Bearer ${options.token}`)
  if (options.apiKey) headers.set('x-api-key', options.apiKey)
  let body: string | undefined
  if (options.rawBody !== undefined) body = options.rawBody
  else if (options.body !== undefined) body = JSON.stringify(options.body)
  if (body !== undefined && !headers.has('content-type')) headers.set('content-type', 'application/json')
  const response = await app.handle(new Request(`http://test.local${path}`, { method, headers, body }))
  const text = await response.text()
  let parsed: unknown = text
  try {
    parsed = JSON.parse(text)
  } catch {
    // not JSON: the test gets the text
  }
  return { status: response.status, headers: response.headers, body: parsed }
}

/** Deletes a test's keys by prefix; never flushes the shared Redis. */
export async function deleteKeys(prefix: string): Promise<void> {
  const redis = new Redis(redisUrl)
  try {
    await deleteByPrefix(redis, prefix)
  } finally {
    redis.disconnect()
  }
}

/** A JWT signed with the test secret. */
export async function userToken(
  sub: string,
  claims: Record<string, unknown> = {},
  options: { secret?: string; expiresIn?: string } = {},
): Promise<string> {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime(options.expiresIn ?? '1h')
    .sign(new TextEncoder().encode(options.secret ?? testJwtSecret))
}

export interface TestUser {
  token: string
  id: string
  sub: string
}

/**
 * The ids of a list paged by `before` (`path` with no query), two to a page, as a client walks it:
 * each page asks for what is strictly older than the last item of the one before. At most `pages`.
 */
export async function idsPagedByBefore(
  ctx: TestContext,
  path: string,
  credential: Pick<CallOptions, 'token' | 'apiKey'>,
  pages = 10,
): Promise<string[]> {
  const ids: string[] = []
  let before = ''
  for (let n = 0; n < pages; n++) {
    const query = before ? `?limit=2&before=${encodeURIComponent(before)}` : '?limit=2'
    const page: { id: string; createdAt: string }[] = (await ctx.call('GET', `${path}${query}`, credential)).body.data
    if (page.length === 0) break
    ids.push(...page.map(item => item.id))
    before = page[page.length - 1]!.createdAt
  }
  return ids
}

/**
 * Half a millisecond after `at` (an ISO time the API showed, whole milliseconds), as a client that keeps
 * microseconds writes a time of that millisecond: an item shown at `at` is strictly older than it.
 */
export const halfAMillisecondAfter = (at: string) => `${at.slice(0, -1)}5Z`

/** The ids of the first page of a list (`path`, no query) strictly older than `before`. */
export async function idsBefore(
  ctx: TestContext,
  path: string,
  credential: Pick<CallOptions, 'token' | 'apiKey'>,
  before: string,
): Promise<string[]> {
  const page = await ctx.call('GET', `${path}?before=${encodeURIComponent(before)}`, credential)
  if (page.status !== 200) throw new Error(`${path}?before=${before}: ${page.status} ${JSON.stringify(page.body)}`)
  return page.body.data.map((item: { id: string }) => item.id)
}

/** Signs a new user in (their first token creates them). */
export async function signUp(ctx: TestContext, sub = `user-${randomBytes(4).toString('hex')}`): Promise<TestUser> {
  const token = await userToken(sub, { email: `${sub}@example.com` })
  const me = await ctx.call('GET', '/v1/auth/me', { token })
  if (me.status !== 200) throw new Error(`sign-up failed: ${me.status} ${JSON.stringify(me.body)}`)
  return { token, id: me.body.data.id, sub }
}

export interface TestAgent {
  id: string
  name: string
  apiKey: string
}

export async function createAgent(ctx: TestContext, owner: TestUser, name?: string): Promise<TestAgent> {
  const agentName = name ?? `agent-${randomBytes(4).toString('hex')}`
  const res = await ctx.call('POST', '/v1/participants', { token: owner.token, body: { name: agentName } })
  if (res.status !== 201) throw new Error(`agent creation failed: ${res.status} ${JSON.stringify(res.body)}`)
  return { id: res.body.data.id, name: agentName, apiKey: res.body.data.apiKey }
}

/** A time-ordered id (UUIDv7), as the rows written at a high rate get (src/ids.ts). */
export const uuidV7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

/** Asserts the contract's error envelope and returns the body. */
export function expectError(result: CallResult, status: number, code: string) {
  const context = `${result.status} ${JSON.stringify(result.body)}`
  if (result.status !== status) throw new Error(`expected ${status} ${code}, got ${context}`)
  const body = result.body
  if (body?.success !== false || body.statusCode !== status || body.error !== code || typeof body.message !== 'string') {
    throw new Error(`expected the error envelope with ${code}, got ${context}`)
  }
  return body
}

export interface Subscribed {
  agent: TestAgent
  user: TestUser
  planId: string
  subscriptionId: string
}

/** A new agent of `owner` with a plan, and a new user subscribed to it. */
export async function subscribedPair(
  ctx: TestContext,
  owner: TestUser,
  terms: { monthlyPriceCents?: number; includedProxyCalls?: number; overagePerCallCents?: number } = {},
): Promise<Subscribed> {
  const agent = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'Basic', monthlyPriceCents: 100, includedProxyCalls: 10, overagePerCallCents: 1, ...terms },
  })
  if (plan.status !== 201) throw new Error(`plan creation failed: ${JSON.stringify(plan.body)}`)
  const user = await signUp(ctx)
  const sub = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId: plan.body.data.id } })
  if (sub.status !== 201) throw new Error(`subscription failed: ${JSON.stringify(sub.body)}`)
  return { agent, user, planId: plan.body.data.id, subscriptionId: sub.body.data.id }
}
