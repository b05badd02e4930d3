/**
 * Postgres going back in time while Redis keeps what it derived from the newer data, under a running
 * service, without a restart: a replica that lagged, promoted and reached through the same address
 * (a proxy here, a failover's DNS name in production); and a dump restored in place of the database.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Queue } from 'bullmq'
import { randomBytes } from 'node:crypto'
import { reachDatabase } from '../src/reach-database.ts'
import { createSql, watchDatabaseIdentity, type DatabaseIdentity, type Sql } from '../src/db.ts'
import { createLog } from '../src/log.ts'
import { createAuthenticator } from '../src/auth/authenticator.ts'
import type { KeyCache } from '../src/auth/key-cache.ts'
import type { UnknownKeyLimit } from '../src/auth/unknown-keys.ts'
import type { Principal } from '../src/auth/principal.ts'
import { migrate } from '../src/migrate.ts'
import { countRecordedBefore } from '../src/metering/count.ts'
import { blogQueueName } from '../src/blog/queue.ts'
import { publishScheduledPost } from '../src/blog/publish.ts'
import { createAgent, createTestContext, signUp, subscribedPair, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { adminUrl, createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { startHeldProxy, type HeldProxy } from './helpers/held-proxy.ts'
import { postgresBinaries, startPostgresServer, type PostgresReplica, type PostgresServer } from './helpers/postgres-server.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { meteredSubscriber, type MeteredSubscriber } from './helpers/usage.ts'
import { setBlog, writePost } from './helpers/blog.ts'
import { until } from './helpers/until.ts'

const bin = postgresBinaries()
if (bin === null) console.warn('postgres-going-back: skipping, the PostgreSQL server binaries are missing')

/** The service's address of its database: a proxy that a failover points elsewhere. */
const through = (proxy: HeldProxy, database: string) => `postgres://postgres@127.0.0.1:${new URL(proxy.url).port}/${database}`

/** New connections go to `url`; open ones are dropped, as the old server's end when it goes. */
async function pointAt(proxy: HeldProxy, url: string) {
  proxy.retarget(url)
  await proxy.stop()
  await proxy.restart()
}

/** Until the process has read the new database's identity (it looks every second by itself). */
async function noticed(ctx: TestContext, before: string | null) {
  await until(async () => (await ctx.deps.database.check().catch(() => before)) !== before, 20_000)
}

const poll = async (ctx: TestContext, agent: TestAgent) => {
  const polled = await ctx.call('GET', '/v1/agent/events', { apiKey: agent.apiKey })
  expect(polled.status).toBe(200)
  return {
    conversations: polled.body.data.pendingConversations.map((c: { userId: string; latestMessage: string }) => [c.userId, c.latestMessage]),
    requests: polled.body.data.serviceRequests.map((r: { input: string }) => r.input),
  }
}
const message = async (ctx: TestContext, agent: TestAgent, user: TestUser, text: string) =>
  expect((await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text } })).status).toBe(201)
const reply = (ctx: TestContext, agent: TestAgent, user: TestUser, text: string) =>
  ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text } })

describe.skipIf(bin === null)('a replica that lagged, promoted while the service runs', () => {
  let primary: PostgresServer
  let replica: PostgresReplica
  let proxy: HeldProxy
  let upstream: Upstream
  let ctx: TestContext
  let owner: TestUser
  let s: MeteredSubscriber
  let late: TestUser
  let newcomer: TestUser
  let lostKey: string
  let kept: string
  let postId: string

  const request = async (sender: TestAgent, input: string) => {
    const sent = await ctx.call('POST', '/v1/agent/service-requests', { apiKey: sender.apiKey, body: { targetAgentId: s.agent.id, input } })
    expect(sent.status).toBe(201)
    return sent.body.data.requestId as string
  }
  const respond = (requestId: string) =>
    ctx.call('POST', '/v1/agent/service-respond', { apiKey: s.agent.apiKey, body: { requestId, output: 'done', success: true } })
  const proxyCall = () =>
    ctx.call('POST', '/v1/agent/proxy-call', { apiKey: s.agent.apiKey, body: { userId: s.user.id, provider: 'acme', method: 'GET', path: '/echo' } })

  beforeAll(async () => {
    primary = await startPostgresServer()
    replica = await primary.startReplica()
    const admin = createSql(primary.url(), { max: 1 })
    await admin`create database app`
    await admin.end()
    const sql = createSql(primary.url('app'), { max: 1 })
    await migrate(sql)
    await sql.end()
    proxy = await startHeldProxy(primary.url('app'))
    upstream = startUpstream()
    const database = { name: 'app', url: through(proxy, 'app'), drop: async () => {} }
    ctx = await createTestContext({ actors: true, database, env: { PROXY_ALLOWED_HOSTS: '127.0.0.1' } })

    owner = await signUp(ctx)
    s = await meteredSubscriber(ctx, owner, upstream.url, { includedProxyCalls: 100 })
    late = await signUp(ctx)
    expect((await ctx.call('POST', '/v1/billing/subscriptions', { token: late.token, body: { planId: s.planId } })).status).toBe(201)
    const sender = await createAgent(ctx, owner)
    await setBlog(ctx, owner, s.agent, { blogEnabled: true })
    postId = (await writePost(ctx, s.agent, { title: 'Embargoed' })).id

    // What the replica has: a message waiting, a request open, a call counted.
    await message(ctx, s.agent, s.user, 'kept')
    kept = await request(sender, 'kept')
    expect((await proxyCall()).status).toBe(200)
    await countRecordedBefore(ctx.deps.sql, new Date(Date.now() + 60_000), new Date())
    await replica.catchUp()
    // A boot there stops with one line (it stopped on the migrations' first write, which a boot with
    // nothing pending no longer makes).
    await expect(reachDatabase(replica.url('app'))).rejects.toThrow(`DATABASE_URL leads to a server in recovery (a hot standby)`)
    await replica.cutOff()

    // What it never gets: that message answered and another, a first one from `late`, the request
    // answered and another, two calls, a key, a user, and the post scheduled a minute ahead.
    expect((await reply(ctx, s.agent, s.user, 'answered')).status).toBe(201)
    await message(ctx, s.agent, s.user, 'lost')
    await message(ctx, s.agent, late, 'lost')
    expect((await respond(kept)).status).toBe(200)
    await request(sender, 'lost')
    for (let i = 0; i < 2; i++) expect((await proxyCall()).status).toBe(200)
    lostKey = (await ctx.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name: 'lost' } })).body.data.key
    expect((await ctx.call('GET', '/v1/auth/me', { token: lostKey })).status).toBe(200)
    newcomer = await signUp(ctx)
    const minute = new Date(ctx.clock.now().getTime() + 60_000).toISOString()
    expect((await ctx.call('PATCH', `/blog/posts/${postId}`, { apiKey: s.agent.apiKey, body: { publishAt: minute } })).status).toBe(200)
    expect(await poll(ctx, s.agent)).toEqual({
      conversations: [
        [s.user.id, 'lost'],
        [late.id, 'lost'],
      ],
      requests: ['lost'],
    })

    const before = ctx.deps.database.current()
    await replica.promote()
    await pointAt(proxy, replica.url('app'))
    await noticed(ctx, before)
  }, 60_000)

  // Pools whose connections were ended under them (the failover, the restore) may take their end()'s 5 s timeout to close.
  afterAll(async () => {
    await ctx?.close()
    await proxy?.close()
    upstream?.stop()
    await replica?.stop()
    await primary?.stop()
  }, 30_000)

  test('the agent’s poll shows what the promoted Postgres holds: its waiting message and open request, nothing lost', async () => {
    expect(await poll(ctx, s.agent)).toEqual({ conversations: [[s.user.id, 'kept']], requests: ['kept'] })
    const status = await ctx.call('GET', '/v1/agent/status', { apiKey: s.agent.apiKey })
    expect(status.body.data.pendingConversations).toBe(1)
  })

  test('writes go on: a reply ends the wait, a message shows, the restored request is answered', async () => {
    expect((await reply(ctx, s.agent, s.user, 'at last')).status).toBe(201)
    expect((await poll(ctx, s.agent)).conversations).toEqual([])
    await message(ctx, s.agent, s.user, 'again')
    expect((await poll(ctx, s.agent)).conversations).toEqual([[s.user.id, 'again']])
    expect((await respond(kept)).status).toBe(200)
    expect((await poll(ctx, s.agent)).requests).toEqual([])
  })

  test('usage counts the calls the promoted Postgres has, not those it lost', async () => {
    const listed = await ctx.call('GET', '/v1/billing/subscriptions', { token: s.user.token })
    expect(listed.body.data[0].usage.proxyCalls).toBe(1)
    expect((await proxyCall()).body.data.usage.periodCalls).toBe(2)
  })

  test('a key it never had is refused, and a user it never had is signed in anew, not failed', async () => {
    expect((await ctx.call('GET', '/v1/auth/me', { token: lostKey })).status).toBe(401)
    expect((await ctx.call('POST', '/v1/auth/api-keys', { token: newcomer.token, body: { name: 'first' } })).status).toBe(201)
  })

  test('the queued job of a lost plan does not publish the post before the plan made since', async () => {
    const hour = new Date(ctx.clock.now().getTime() + 3_600_000).toISOString()
    expect((await ctx.call('PATCH', `/blog/posts/${postId}`, { apiKey: s.agent.apiKey, body: { publishAt: hour } })).status).toBe(200)
    // The new plan has the lost one's number, so its job's id: the queue kept the lost plan's job, due in a minute.
    const queue = new Queue(blogQueueName, { connection: ctx.deps.redis, prefix: ctx.deps.keys.bullPrefix })
    try {
      const jobs = await queue.getJobs(['delayed', 'waiting'])
      const job = jobs.find(j => j.data.postId === postId)!
      expect(job.data.version).toBe(1)
      expect(job.delay).toBeLessThanOrEqual(60_000)
      ctx.clock.advance(61_000)
      expect(await publishScheduledPost(ctx.deps, job.data)).toBe(false)
      const post = await ctx.call('GET', `/blog/posts/${postId}`, { apiKey: s.agent.apiKey })
      expect(post.body.data).toMatchObject({ status: 'scheduled', publishAt: hour })
    } finally {
      await queue.close()
    }
  })
})

describe.skipIf(bin === null)('a dump restored in place of the database while the service runs', () => {
  let database: TestDatabase
  let ctx: TestContext
  const dir = mkdtempSync(join(tmpdir(), 'am-dump-'))

  beforeAll(async () => {
    database = await createTestDatabase()
    ctx = await createTestContext({ actors: true, database })
  })
  afterAll(async () => {
    await ctx?.close()
    // The context leaves a database it was given to its maker.
    await database?.drop()
    rmSync(dir, { recursive: true, force: true })
  }, 30_000)

  test('the agent’s poll shows what the dump holds, and a reply ends the wait', async () => {
    const { agent, user, planId } = await subscribedPair(ctx, await signUp(ctx))
    const late = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: late.token, body: { planId } })
    await message(ctx, agent, user, 'kept')
    const dump = join(dir, 'dump')
    await Bun.$`${join(bin!, 'pg_dump')} -Fc -f ${dump} ${database.url}`.quiet()

    expect((await reply(ctx, agent, user, 'answered')).status).toBe(201)
    await message(ctx, agent, user, 'lost')
    await message(ctx, agent, late, 'lost')
    expect((await poll(ctx, agent)).conversations).toHaveLength(2)

    // The operator's restore: the database dropped (its sessions ended), made again under its name, the dump loaded.
    const before = ctx.deps.database.current()
    const admin = createSql(adminUrl, { max: 1 })
    await admin`drop database ${admin(database.name)} with (force)`
    await admin`create database ${admin(database.name)}`
    await admin.end()
    await Bun.$`${join(bin!, 'pg_restore')} -d ${database.url} ${dump}`.quiet()
    await noticed(ctx, before)

    expect((await poll(ctx, agent)).conversations).toEqual([[user.id, 'kept']])
    expect((await reply(ctx, agent, user, 'at last')).status).toBe(201)
    expect((await poll(ctx, agent)).conversations).toEqual([])
  }, 30_000)
})

describe('a server that refuses to tell its identity', () => {
  test('is said once, and reads as none', async () => {
    const database = await createTestDatabase()
    const role = `am_noid_${randomBytes(4).toString('hex')}`
    const admin = createSql(adminUrl, { max: 1 })
    const owner = createSql(database.url, { max: 1 })
    const lines: string[] = []
    let sql: Sql | undefined
    let watched: DatabaseIdentity | undefined
    try {
      // A managed service's role: `pg_control_system()` is not its to call (in this database only).
      await admin`create role ${admin(role)} login`
      await owner`revoke execute on function pg_control_system() from public`
      const url = new URL(database.url)
      url.username = role
      sql = createSql(url.toString(), { max: 1 })
      watched = await watchDatabaseIdentity(
        sql,
        createLog('info', line => lines.push(line)),
        50,
      )
      await Bun.sleep(300)
      expect(await watched.check()).toBeNull()

      const warnings = lines.map(line => JSON.parse(line)).filter(line => line.level === 'warn')
      expect(warnings).toHaveLength(1)
      expect(warnings[0].msg).toContain('refuses to tell its identity')
      expect(warnings[0].error).toContain('permission denied for function pg_control_system')
    } finally {
      watched?.close()
      await sql?.end()
      await owner.end()
      await database.drop()
      await admin`drop role if exists ${admin(role)}`.catch(() => {})
      await admin.end()
    }
  })
})

describe('a dump restored with --clean under a running process', () => {
  test('is not taken for a server that refuses to tell its identity', async () => {
    const database = await createTestDatabase()
    const sql = createSql(database.url, { max: 1 })
    const lines: string[] = []
    let watched: DatabaseIdentity | undefined
    try {
      // Checked by hand only: the timer's reads would race the steps of the restore below.
      watched = await watchDatabaseIdentity(
        sql,
        createLog('info', line => lines.push(line)),
        3_600_000,
      )
      const before = watched.current()
      expect(before).not.toBeNull()
      const changes: string[] = []
      watched.onChange(identity => changes.push(identity))

      // pg_restore --clean drops the table, then creates it again: between the two it is missing.
      await sql`alter table conversations rename to conversations_dropped`
      expect(await watched.check()).toBe(before)
      await sql`create table conversations (id int)`
      expect(await watched.check()).not.toBe(before)

      expect(changes).toHaveLength(1)
      expect(lines.map(line => JSON.parse(line)).filter(line => line.level !== 'info')).toEqual([])
    } finally {
      watched?.close()
      await sql.end()
      await database.drop()
    }
  })
})

describe('a sign-in under way as another database is noticed', () => {
  const userOf = (principal: Principal | null) => (principal?.kind === 'user' ? principal.userId : null)

  test('keeps nothing: the user’s next call signs them in where the pools lead now', async () => {
    const database = await createTestDatabase()
    const sql = createSql(database.url, { max: 4 })
    let changed: ((identity: string, previous: string) => void) | undefined
    const claims = { sub: `sub-${randomBytes(4).toString('hex')}`, email: null, walletAddress: null }
    // Only JWTs are used here: neither the key cache nor the unknown keys' limit is asked.
    const authenticator = createAuthenticator({
      sql,
      verifyJwt: async () => claims,
      keys: {} as KeyCache,
      database: { onChange: listener => void (changed = listener) },
      clientIp: () => 'local',
      unknownKeys: {} as UnknownKeyLimit,
    })
    const request = new Request('http://test.local/', { headers: { authorization: 'Bearer any.jwt.here' } })
    try {
      // The change is noticed while the sign-in's statement runs: held behind another's insert of the user.
      let rollBack!: () => void
      const holding = sql
        .begin(async tx => {
          await tx`insert into users (provider_id) values (${claims.sub})`
          await new Promise<void>(resolve => (rollBack = resolve))
          throw new Error('rolled back')
        })
        .catch(() => {})
      await until(async () => rollBack !== undefined)
      const signingIn = authenticator.authenticate(request, null)
      await until(async () => (await sql`select 1 from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`).length > 0)
      changed!('new', 'old')
      rollBack()
      await holding
      const first = userOf(await signingIn)
      // The database it now reaches does not have the user.
      await sql`delete from users where provider_id = ${claims.sub}`
      const next = userOf(await authenticator.authenticate(request, null))
      expect(next).not.toBe(first)
      expect((await sql`select id from users where id = ${next}`).length).toBe(1)
    } finally {
      await sql.end()
      await database.drop()
    }
  })
})
