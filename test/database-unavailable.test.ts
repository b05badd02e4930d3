/**
 * PostgreSQL up but unable to serve the service: the role's password changed or its login revoked,
 * the database renamed or closed to connections, its host name not resolving, its disk full. Each is
 * an outage (503 `unavailable`, never 500), an actor's command waits for it to end (never
 * dead-lettered), and the service serves again once it ends. A private server: the faults are the
 * server's, and the service connects as a role of its own with a password (a superuser passes by
 * connection limits and `pg_hba.conf`).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createSql, isConnectionError, isDatabaseUnavailable, type Sql } from '../src/db.ts'
import { migrate } from '../src/migrate.ts'
import { isOutage } from '../src/actors/work.ts'
import { createLog } from '../src/log.ts'
import {
  createAgent,
  createTestContext,
  expectError,
  signUp,
  subscribedPair,
  userToken,
  type Subscribed,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { startPostgresServer, type PostgresServer } from './helpers/postgres-server.ts'
import { smallDisk, smallDiskRefused } from './helpers/small-disk.ts'
import { until } from './helpers/until.ts'

const db = 'am_unavailable'
let server: PostgresServer
let admin: Sql
let ctx: TestContext
let owner: TestUser
let pair: Subscribed
/** What the service logged (warnings and errors). */
const logged: string[] = []
const serviceUrl = () => server.url(db).replace('postgres@', 'svc:pw@')

beforeAll(async () => {
  server = await startPostgresServer()
  admin = createSql(server.url(), { max: 1, applicationName: 'am-test-admin' })
  await admin.unsafe(`create role svc login password 'pw'`)
  await admin.unsafe(`create database ${db} owner svc`)
  // The test's own sessions (as postgres) stay trusted; the service's must give its password.
  const [hba] = await admin<{ hba_file: string }[]>`show hba_file`
  await Bun.write(hba!.hba_file, 'local all postgres trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n')
  await admin`select pg_reload_conf()`
  const migrator = createSql(serviceUrl(), { max: 1 })
  await migrate(migrator)
  await migrator.end()
  ctx = await createTestContext({
    database: { name: db, url: serviceUrl(), drop: async () => {} },
    actors: true,
    log: createLog('warn', line => logged.push(line)),
  })
  owner = await signUp(ctx, 'owner')
  pair = await subscribedPair(ctx, owner)
}, 60_000)
afterAll(async () => {
  // Pools whose connections were ended under them may take their end()'s 5 s timeout to close.
  await ctx?.close()
  await admin?.end()
  await server?.stop()
}, 30_000)

/** Ends the service's sessions, so that its pools connect afresh. */
const endSessions = () => admin`select pg_terminate_backend(pid) from pg_stat_activity where datname = ${db} and pid <> pg_backend_pid()`

const rename = (from: string, to: string) => admin.unsafe(`alter database ${from} rename to ${to}`)

/** A change of the server's that keeps the service from connecting, and its undoing. */
const faults: { name: string; code: string; start(): Promise<unknown>; end(): Promise<unknown> }[] = [
  {
    name: 'the role’s password changed',
    code: '28P01',
    start: () => admin.unsafe(`alter role svc password 'other'`),
    end: () => admin.unsafe(`alter role svc password 'pw'`),
  },
  {
    name: 'the role’s login revoked',
    code: '28000',
    start: () => admin.unsafe('alter role svc nologin'),
    end: () => admin.unsafe('alter role svc login'),
  },
  {
    name: 'the database closed to connections',
    code: '55000',
    start: () => admin.unsafe(`alter database ${db} allow_connections false`),
    end: () => admin.unsafe(`alter database ${db} allow_connections true`),
  },
  {
    name: 'the role’s CONNECT revoked',
    code: '42501',
    start: () => admin.unsafe(`revoke connect on database ${db} from public, svc`),
    end: () => admin.unsafe(`grant connect on database ${db} to svc`),
  },
  {
    name: 'the database renamed',
    code: '3D000',
    // A database with sessions cannot be renamed: closed to connections first, the service's ended.
    start: async () => {
      await admin.unsafe(`alter database ${db} allow_connections false`)
      await endSessions()
      await rename(db, `${db}_moved`)
      await admin.unsafe(`alter database ${db}_moved allow_connections true`)
    },
    end: () => rename(`${db}_moved`, db),
  },
]

const participant = () => ctx.call('GET', `/v1/participants/${pair.agent.id}`, { token: owner.token })
const patch = (displayName: string) => ctx.call('PATCH', `/v1/participants/${pair.agent.id}`, { token: owner.token, body: { displayName } })

describe('a database that refuses the service’s connections', () => {
  for (const fault of faults) {
    test(`${fault.name} (${fault.code}): 503 unavailable, not 500, until it is undone`, async () => {
      // What postgres.js surfaces, on a connection of the service's own settings.
      const probe = createSql(serviceUrl(), { max: 1 })
      await fault.start()
      try {
        await endSessions()
        const refused = await probe`select 1`.catch((error: unknown) => error)
        expect(refused).toMatchObject({ code: fault.code, severity: 'FATAL' })
        // A connection refused or ended so may have sent a statement: the reply writer's sense.
        expect(isConnectionError(refused)).toBe(true)
        expect(isOutage(refused)).toBe(true)
        for (let i = 0; i < 3; i++) {
          const read = await participant()
          expectError(read, 503, 'unavailable')
          // Every 503 says when to try again.
          expect(read.headers.get('retry-after')).toBe('1')
          expectError(await patch(`Refused ${i}`), 503, 'unavailable')
        }
        expectError(
          await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: pair.agent.apiKey, body: { userId: pair.user.id, text: 'x' } }),
          503,
          'unavailable',
        )
      } finally {
        await fault.end()
        await probe.end()
      }
      // The pools reconnect on their own (at most 500 ms apart).
      await until(async () => (await participant()).status === 200, 5000)
      expect((await patch('Served again')).status).toBe(200)
    })
  }
})

describe('a database host name that does not resolve', () => {
  test('requests are 503 unavailable, not 500; GET /health says postgres is down', async () => {
    const unresolvable = await createTestContext({
      database: { name: db, url: `postgres://svc:pw@db.invalid:${server.port}/${db}`, drop: async () => {} },
      relay: false,
    })
    try {
      const failed = await unresolvable.deps.sql`select 1`.catch((error: unknown) => error)
      expect(failed).toMatchObject({ code: 'ENOTFOUND', syscall: 'getaddrinfo' })
      expect(isConnectionError(failed)).toBe(true)
      const token = await userToken(`dns-${randomBytes(4).toString('hex')}`)
      expectError(await unresolvable.call('GET', '/v1/auth/me', { token }), 503, 'unavailable')
      const health = await unresolvable.call('GET', '/health')
      expect(health.status).toBe(503)
      expect(health.headers.get('retry-after')).toBe('1')
      expect(health.body.postgres).toBe('down')
    } finally {
      await unresolvable.close()
    }
  })
})

const disk = smallDisk('1m', 'postgres')
afterAll(() => disk?.remove())

describe('a full disk under the database', () => {
  test.skipIf(disk === null)(
    `a write that needs room is 503 unavailable, not 500; a message sent meanwhile is stored once there is room, not dead-lettered, the wait logged once${disk === null ? ` (skipped: ${smallDiskRefused ?? 'mount refused'})` : ''}`,
    async () => {
      const { agent, user } = pair
      // A conversation with one short message, then the messages moved onto the small disk: its
      // TOAST table has no page yet, so each long message needs the disk to grow.
      const first = await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello' } })
      expect(first.status).toBe(201)
      await admin.unsafe(`create tablespace small owner svc location '${disk!.dir}'`)
      const moved = createSql(serviceUrl(), { max: 1 })
      // Moving a table waits for every lock on it: the service's sessions are ended first.
      await moved`select pg_terminate_backend(pid) from pg_stat_activity where datname = ${db} and pid <> pg_backend_pid()`
      await moved`alter table messages set tablespace small`
      await moved`alter table service_requests set tablespace small`
      await moved`create table spill (t text) tablespace small`
      const long = () => randomBytes(5000).toString('hex')
      disk!.fill()
      try {
        // What postgres.js surfaces: a statement refused, on a live connection, having changed nothing.
        const full = await moved`insert into spill values (${long()})`.catch((error: unknown) => error)
        expect(full).toMatchObject({ code: '53100', severity: 'ERROR' })
        expect(isConnectionError(full)).toBe(false)
        expect(isDatabaseUnavailable(full)).toBe(true)
        expect(isOutage(full)).toBe(true)

        // The API's own write (the reply writer's statement).
        const reply = await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: long() } })
        expectError(reply, 503, 'unavailable')
        // Reads go on.
        expect((await participant()).status).toBe(200)

        // An actor's command: its turn fails while the disk is full. It used to be counted as failing
        // and moved to the dead-letter stream after five tries (about 5 s): lost once there was room.
        const text = long()
        const linesBefore = logged.length
        const sent = ctx.call('POST', `/v1/conversations/${agent.id}/messages`, {
          token: user.token,
          body: { text },
          headers: { 'idempotency-key': randomBytes(8).toString('hex') },
        })
        // Another actor's command, failing on another table's file (its own turn: a new agent's).
        const [sender, target] = [await createAgent(ctx, owner), await createAgent(ctx, owner)]
        const input = long()
        const requested = ctx.call('POST', '/v1/agent/service-requests', { apiKey: sender.apiKey, body: { targetAgentId: target.id, input } })
        await Bun.sleep(7000)
        // The workers said why the commands wait, once, not at each of their attempts meanwhile: once
        // for the full disk, though the messages name the files that could not be extended.
        const waits = logged
          .slice(linesBefore)
          .map(line => JSON.parse(line) as { msg: string; error?: string; code?: string })
          .filter(record => record.msg === 'actor turn failed; its commands wait in their mailboxes and are tried again')
        const diskFull = waits.filter(wait => wait.error?.includes('No space left on device'))
        expect(diskFull.map(wait => wait.code)).toEqual(['53100'])
        expect(new Set(waits.map(wait => wait.code)).size).toBe(waits.length)
        disk!.free()
        // Answered 201 if applied within the sender's 10 s wait, else 503 with the command kept.
        expect([201, 503]).toContain((await sent).status)
        expect([201, 503]).toContain((await requested).status)
        await until(async () => (await moved`select 1 from messages where text = ${text}`).length === 1, 10_000)
        await until(async () => (await moved`select 1 from service_requests where position(${input} in input) > 0`).length === 1, 10_000)
        expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`agent:${agent.id}`).dead)).toBe(0)
        const [stored] = await moved<{ n: number }[]>`select count(*)::int as n from messages where text = ${text}`
        expect(stored!.n).toBe(1)
      } finally {
        disk!.free()
        await moved`alter table messages set tablespace pg_default`.catch(() => {})
        await moved`alter table service_requests set tablespace pg_default`.catch(() => {})
        await moved`drop table if exists spill`.catch(() => {})
        await moved.end()
      }
      // Served again.
      expect(
        (await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: 'room again' } })).status,
      ).toBe(201)
    },
    40_000,
  )
})
