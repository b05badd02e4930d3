/**
 * Rotating the service's secrets as docs/operations.md says, old and new processes side by side (each
 * a context of its own configuration on one database and Redis prefix): the HS256 secret, the metrics
 * token, and the connections key with `connections:reseal` run as a command while the service serves.
 * No token of either secret is refused while both are in use, no scrape fails, no credential is lost.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createTestContext, expectError, signUp, testJwtSecret, userToken, type TestContext, type TestUser } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { meteredSubscriber, type MeteredSubscriber } from './helpers/usage.ts'
import { exitWithin, processGroup } from './helpers/processes.ts'
import { createLog } from '../src/log.ts'

const root = mkdtempSync(join(tmpdir(), 'am-secret-rotation-'))
const { start, killAll } = processGroup()
const contexts: TestContext[] = []
let upstream: Upstream

beforeAll(() => {
  upstream = startUpstream()
})
afterAll(async () => {
  await killAll()
  upstream.stop()
  // The first made owns the database; the others share it.
  for (const ctx of contexts.splice(0).reverse()) await ctx.close().catch(() => {})
  rmSync(root, { recursive: true, force: true })
})

/** A process of the service configured with `env`, on the first context's database and Redis prefix when `beside` is given. */
async function processWith(env: Record<string, string>, beside?: TestContext, log?: ReturnType<typeof createLog>): Promise<TestContext> {
  const ctx = await createTestContext({
    ...(beside ? { database: beside.database } : {}),
    env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', ...(beside ? { REDIS_PREFIX: beside.config.redisPrefix } : {}), ...env },
    ...(log ? { log } : {}),
  })
  contexts.push(ctx)
  return ctx
}

const me = (ctx: TestContext, token: string) => ctx.call('GET', '/v1/auth/me', { token })

describe('AUTH_JWT_SECRET', () => {
  test('rotated through AUTH_JWT_SECRET_PREVIOUS: every token of either secret is taken while both are in use, as the same user', async () => {
    const oldSecret = testJwtSecret
    const newSecret = randomBytes(24).toString('hex')
    const before = await processWith({ AUTH_JWT_SECRET: oldSecret })
    const alice: TestUser = await signUp(before)

    // 1. The rolling restart: the new secret current, the old one previous; the provider still signs with the old.
    const during = await processWith({ AUTH_JWT_SECRET: newSecret, AUTH_JWT_SECRET_PREVIOUS: oldSecret }, before)
    const oldToken = await userToken(alice.sub)
    for (const ctx of [before, during]) expect((await me(ctx, oldToken)).body.data.id).toBe(alice.id)

    // 2. Every process restarted, the provider signs with the new secret: tokens of both arrive.
    const newToken = await userToken(alice.sub, {}, { secret: newSecret })
    expect((await me(during, newToken)).body.data.id).toBe(alice.id)
    expect((await me(during, oldToken)).body.data.id).toBe(alice.id)
    // A new user's first token, signed with the new secret, creates them; with the old, finds them.
    const bob = await userToken('bob-after-switch', {}, { secret: newSecret })
    const bobId = (await me(during, bob)).body.data.id
    expect((await me(during, await userToken('bob-after-switch'))).body.data.id).toBe(bobId)

    // The previous secret verifies only: a token it signed is held to every other rule, and a third secret is refused.
    expectError(await me(during, await userToken(alice.sub, {}, { expiresIn: '-2m' })), 401, 'invalid_token')
    expectError(await me(during, await userToken(alice.sub, {}, { secret: randomBytes(24).toString('hex') })), 401, 'invalid_token')

    // 3. AUTH_MAX_TOKEN_AGE later, the previous secret removed: the new tokens go on, as the same users.
    const after = await processWith({ AUTH_JWT_SECRET: newSecret }, before)
    expect((await me(after, newToken)).body.data.id).toBe(alice.id)
    expect((await me(after, bob)).body.data.id).toBe(bobId)
    expectError(await me(after, oldToken), 401, 'invalid_token')
  })
})

describe('METRICS_TOKEN', () => {
  test('rotated through METRICS_TOKEN_PREVIOUS: the scraper’s old and new tokens are both taken, nothing else', async () => {
    const oldToken = randomBytes(24).toString('hex')
    const newToken = randomBytes(24).toString('hex')
    const during = await processWith({ METRICS_TOKEN: newToken, METRICS_TOKEN_PREVIOUS: oldToken })
    for (const token of [oldToken, newToken]) expect((await during.call('GET', '/metrics', { token })).status).toBe(200)
    expectError(await during.call('GET', '/metrics', { token: randomBytes(24).toString('hex') }), 401, 'invalid_token')
    expectError(await during.call('GET', '/metrics'), 401, 'unauthorized')
    const after = await processWith({ METRICS_TOKEN: newToken }, during)
    expect((await after.call('GET', '/metrics', { token: newToken })).status).toBe(200)
    expectError(await after.call('GET', '/metrics', { token: oldToken }), 401, 'invalid_token')
  })
})

describe('CONNECTIONS_KEY', () => {
  const key = () => randomBytes(32).toString('hex')
  const call = (ctx: TestContext, s: MeteredSubscriber) =>
    ctx.call('POST', '/v1/agent/proxy-call', {
      apiKey: s.agent.apiKey,
      body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' },
    })
  /** A proxy call that reached the upstream with the stored credential. */
  const expectCredentialSent = async (ctx: TestContext, s: MeteredSubscriber) => {
    const res = await call(ctx, s)
    if (res.status !== 200) throw new Error(`proxy call ${res.status} ${JSON.stringify(res.body)}`)
    expect(res.body.data.body.headers.authorization).toBe('Bearer upstream-secret-token')
  }
  const metered = async (ctx: TestContext, s: MeteredSubscriber) => {
    const [row] = await ctx.deps.sql<{ n: number }[]>`
      select (select count(*) from usage_uncounted where subscription_id = ${s.subscriptionId})
        + (select count(*) from usage_events where subscription_id = ${s.subscriptionId}) as n
    `
    return Number(row!.n)
  }
  const reseal = async (ctx: TestContext, env: Record<string, string>) => {
    const cli = start(['src/cli/connections-reseal.ts'], {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? root,
      DATABASE_URL: ctx.database.url,
      ...env,
    })
    const code = await exitWithin(cli.proc, 20_000)
    return { code, stdout: (await cli.stdout).trim(), stderr: (await cli.stderr).trim() }
  }

  test('a credential no configured key opens: 503 in the envelope, upstream not called, nothing metered, a log line saying what to do', async () => {
    const sealedWith = key()
    const before = await processWith({ CONNECTIONS_KEY: sealedWith })
    const s = await meteredSubscriber(before, await signUp(before), upstream.url)
    const lines: string[] = []
    const changed = await processWith(
      { CONNECTIONS_KEY: key() },
      before,
      createLog('error', line => lines.push(line)),
    )
    const received = upstream.received.length
    for (let i = 0; i < 3; i++) {
      const body = expectError(await call(changed, s), 503, 'unavailable')
      expect(body.message).toContain('stored credential cannot be read')
    }
    expect(upstream.received.length).toBe(received)
    expect(await metered(changed, s)).toBe(0)
    // One record for the three calls (once a minute), naming the connection and the way out; never the credential.
    const records = lines.map(line => JSON.parse(line)).filter(record => record.msg.includes('CONNECTIONS_KEY_PREVIOUS'))
    expect(records).toHaveLength(1)
    expect(records[0]).toMatchObject({ level: 'error', userId: s.user.id, connectionId: expect.any(String) })
    expect(records[0].msg).toContain('connections:reseal')
    expect(lines.join('\n')).not.toContain('upstream-secret-token')
    // The key given back as the previous one, the same connection works again.
    await expectCredentialSent(await processWith({ CONNECTIONS_KEY: key(), CONNECTIONS_KEY_PREVIOUS: sealedWith }, before), s)

    // The command says which connections neither key opens, and fails.
    const refused = await reseal(changed, { CONNECTIONS_KEY: key() })
    expect(refused.code).toBe(1)
    expect(refused.stdout).toBe('connections:reseal: 0 sealed again with CONNECTIONS_KEY, 0 already were, 1 unreadable')
    expect(refused.stderr).toContain((await changed.deps.sql`select id from connections where user_id = ${s.user.id}`)[0]!.id)
    expect(refused.stderr).toContain('give the key that sealed them as CONNECTIONS_KEY_PREVIOUS and run again')
    expect(refused.stderr.split('\n')).toHaveLength(1)
  })

  test('rotated through CONNECTIONS_KEY_PREVIOUS and connections:reseal while proxy calls run: no call fails, no credential is lost', async () => {
    const oldKey = key()
    const newKey = key()
    const before = await processWith({ CONNECTIONS_KEY: oldKey })
    const owner = await signUp(before)
    const subscribers: MeteredSubscriber[] = []
    for (let i = 0; i < 4; i++) subscribers.push(await meteredSubscriber(before, owner, upstream.url))

    // 1. Every process restarted with the new key current and the old one previous: old credentials open,
    // new ones are sealed with the new key.
    const during = await processWith({ CONNECTIONS_KEY: newKey, CONNECTIONS_KEY_PREVIOUS: oldKey }, before)
    for (const s of subscribers) await expectCredentialSent(during, s)
    subscribers.push(await meteredSubscriber(during, owner, upstream.url))

    // 2. The re-seal, while proxy calls go on through the service.
    let calling = true
    const failures: string[] = []
    let calls = 0
    const traffic = (async () => {
      while (calling) {
        for (const s of subscribers) {
          const res = await call(during, s)
          calls++
          if (res.status !== 200) failures.push(`${res.status} ${JSON.stringify(res.body)}`)
        }
      }
    })()
    const env = { CONNECTIONS_KEY: newKey, CONNECTIONS_KEY_PREVIOUS: oldKey }
    let first
    try {
      first = await reseal(during, env)
    } finally {
      calling = false
      await traffic
    }
    expect(failures).toEqual([])
    expect(calls).toBeGreaterThan(0)
    // The four made before, sealed again; the fifth was sealed with the new key.
    expect(first).toEqual({ code: 0, stdout: 'connections:reseal: 4 sealed again with CONNECTIONS_KEY, 1 already were, 0 unreadable', stderr: '' })
    // Run again (or after an interruption): nothing left to do.
    const second = await reseal(during, env)
    expect(second).toEqual({ code: 0, stdout: 'connections:reseal: 0 sealed again with CONNECTIONS_KEY, 5 already were, 0 unreadable', stderr: '' })

    // 3. The old key removed: every credential, old or new, still reaches its upstream; the command agrees.
    const after = await processWith({ CONNECTIONS_KEY: newKey }, before)
    for (const s of subscribers) await expectCredentialSent(after, s)
    expect((await reseal(after, { CONNECTIONS_KEY: newKey })).stdout).toBe(
      'connections:reseal: 0 sealed again with CONNECTIONS_KEY, 5 already were, 0 unreadable',
    )
  }, 60_000)
})
