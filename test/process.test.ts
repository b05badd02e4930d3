import { afterAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { createSql } from '../src/db.ts'
import { createKeys } from '../src/keys.ts'
import { migrate, readMigrations } from '../src/migrate.ts'
import { deleteKeys, randomPrefix, userToken } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { postgresBinaries, startPostgresServer, type PostgresServer } from './helpers/postgres-server.ts'
import { deploymentEnv, descendants, exitOnSecondSigterm, exitWithin, processGroup, type Started } from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'
import { startPgBouncer } from './helpers/pgbouncer.ts'
import { startRedisCluster } from './helpers/redis-cluster.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { until } from './helpers/until.ts'

const root = mkdtempSync(join(tmpdir(), 'am-process-'))
const { start, killAll } = processGroup()
const databases: TestDatabase[] = []
const servers: PostgresServer[] = []
const prefixes: string[] = []

afterAll(async () => {
  await killAll()
  await Promise.all(servers.map(server => server.stop()))
  await Promise.all(databases.map(database => database.drop()))
  await Promise.all(prefixes.map(prefix => deleteKeys(prefix)))
  rmSync(root, { recursive: true, force: true })
})

async function emptyDatabase(): Promise<TestDatabase> {
  const database = await createTestDatabase({ empty: true })
  databases.push(database)
  return database
}

/** The environment of a real deployment, built from scratch so nothing leaks in from the test runner. */
function environment(database: Pick<TestDatabase, 'url'>, overrides: Record<string, string | undefined> = {}): Record<string, string> {
  const prefix = randomPrefix()
  prefixes.push(prefix)
  return deploymentEnv(root, prefix, { DATABASE_URL: database.url, ...overrides })
}

async function waitForHealth(port: number, started: Started, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (started.proc.exitCode !== null) {
      throw new Error(`exited with ${started.proc.exitCode} before answering: ${await started.stderr}`)
    }
    try {
      const response = await fetch(`http://127.0.0.1:${port}/health`)
      if (response.status === 200) {
        expect(await response.json()).toEqual({ status: 'ok', postgres: 'ok', redis: 'ok' })
        return
      }
    } catch {
      // not listening yet
    }
    await Bun.sleep(100)
  }
  throw new Error(`no healthy answer on port ${port} within ${ms} ms`)
}

/** A PostgreSQL ErrorResponse message (FATAL), as a server or a pooler sends one at startup. */
function errorResponse(code: string, message: string): Buffer {
  const fields = Buffer.from(`SFATAL\0VFATAL\0C${code}\0M${message}\0\0`)
  const head = Buffer.alloc(5)
  head.write('E')
  head.writeInt32BE(fields.length + 4, 1)
  return Buffer.concat([head, fields])
}

/** POSTs JSON as `token`, its body in two parts; returns the first write's completion and a finisher. */
function slowRequest(port: number, path: string, token: string, body: string) {
  const head =
    `POST ${path} HTTP/1.1\r\n` +
    `host: 127.0.0.1:${port}\r\n` +
    `authorization: Bearer ${token}\r\n` +
    'content-type: application/json\r\n' +
    `content-length: ${Buffer.byteLength(body)}\r\n` +
    'connection: close\r\n\r\n'
  const socket = connect(port, '127.0.0.1')
  let received = ''
  socket.on('data', chunk => (received += chunk.toString()))
  const ended = new Promise<string>((resolve, reject) => {
    socket.on('end', () => resolve(received))
    socket.on('error', reject)
  })
  const half = Math.floor(body.length / 2)
  const opened = new Promise<void>(resolve => socket.on('connect', () => socket.write(head + body.slice(0, half), () => resolve())))
  return {
    opened,
    async finish(): Promise<{ status: number; body: any }> {
      socket.write(body.slice(half))
      const text = await ended
      const [headers = '', payload = ''] = text.split('\r\n\r\n')
      return { status: Number(headers.split(' ')[1]), body: JSON.parse(payload) }
    },
    destroy: () => socket.destroy(),
  }
}

const hasServerBinaries = postgresBinaries() !== null
if (!hasServerBinaries) console.warn('process: skipping the PostgreSQL restart test, initdb and pg_ctl are missing')

/**
 * Starts the service (`roles`) on a Redis of its own, then `up`, stops (or pauses) that Redis, waits
 * until the service is not ready, then `down`, and sends SIGTERM: the drain must finish within
 * SHUTDOWN_TIMEOUT_MS and exit 0.
 */
async function drainWithRedisGone(
  roles: string[],
  extraEnv: Record<string, string>,
  steps: { up(world: { redis: { url: string } }): Promise<unknown>; down(): Promise<unknown> },
  outage: { paused?: boolean; shutdownTimeoutMs?: number } = {},
): Promise<void> {
  const database = await emptyDatabase()
  const redis = await startRedisServer()
  try {
    const port = await freePort()
    const shutdownTimeoutMs = outage.shutdownTimeoutMs ?? 8000
    const env = environment(database, { PORT: String(port), REDIS_URL: redis.url, SHUTDOWN_TIMEOUT_MS: String(shutdownTimeoutMs), ...extraEnv })
    const service = start(['src/main.ts', ...roles], env)
    await waitForHealth(port, service)
    await steps.up({ redis })
    if (outage.paused) redis.pause()
    else await redis.down({ keepData: false })
    // Every connection has noticed and waits to reconnect.
    await until(async () => (await fetch(`http://127.0.0.1:${port}/health/ready`)).status === 503, 10_000)
    await steps.down()
    service.proc.kill('SIGTERM')
    expect(await exitWithin(service.proc, shutdownTimeoutMs + 5000)).toBe(0)
    expect(await service.stdout).not.toContain('shutdown timed out')
  } finally {
    await redis.close()
  }
}

/** Boots an API process on `env`'s PORT, waits until it is healthy, then drains it with SIGTERM (exit 0). */
async function servesThenDrains(env: Record<string, string>): Promise<void> {
  const api = start(['src/main.ts', '--api'], env)
  await waitForHealth(Number(env.PORT), api)
  api.proc.kill('SIGTERM')
  expect(await exitWithin(api.proc, 15_000)).toBe(0)
}

/** Starts a process of the service that must refuse to boot; returns the one line it wrote on stderr. */
async function refusedBoot(env: Record<string, string>, role = '--api'): Promise<string> {
  const service = start(['src/main.ts', role], env)
  expect(await exitWithin(service.proc, 20_000), role).not.toBe(0)
  const lines = (await service.stderr).trimEnd().split('\n')
  expect(lines, role).toHaveLength(1)
  return lines[0]!
}

describe('the service as a process', () => {
  test('two API processes started together on one empty database both come up; migrations run once', async () => {
    const database = await emptyDatabase()
    const ports = [await freePort(), await freePort()]
    const both = ports.map(port => start(['src/main.ts', '--api'], environment(database, { PORT: String(port) })))
    await Promise.all(both.map((started, index) => waitForHealth(ports[index]!, started)))

    const sql = createSql(database.url, { max: 1 })
    try {
      const rows = await sql<{ id: number }[]>`select id from migrations order by id`
      expect(rows.map(row => row.id)).toEqual(readMigrations().map(migration => migration.id))
    } finally {
      await sql.end()
    }

    for (const { proc } of both) proc.kill('SIGTERM')
    for (const { proc } of both) expect(await exitWithin(proc, 15_000)).toBe(0)
  }, 30_000)

  test('the token CLI signs tokens that expire, by default after AUTH_MAX_TOKEN_AGE, and refuses a --ttl past it', async () => {
    const env = environment({ url: 'postgres://unused@127.0.0.1/unused' }, { AUTH_MAX_TOKEN_AGE: '7200' })
    const claims = async (args: string[]) => {
      const cli = start(['src/cli/token.ts', '--sub', 'alice', ...args], env)
      expect(await exitWithin(cli.proc, 10_000)).toBe(0)
      return JSON.parse(Buffer.from((await cli.stdout).trim().split('.')[1]!, 'base64url').toString()) as { iat: number; exp: number }
    }
    const byDefault = await claims([])
    expect(byDefault.exp - byDefault.iat).toBe(7200)
    const short = await claims(['--ttl', '60'])
    expect(short.exp - short.iat).toBe(60)
    for (const ttl of ['7201', '0', '1h']) {
      const refused = start(['src/cli/token.ts', '--sub', 'alice', '--ttl', ttl], env)
      expect(await exitWithin(refused.proc, 10_000)).toBe(2)
      expect(await refused.stderr).toContain('AUTH_MAX_TOKEN_AGE')
    }
    // What the service would refuse (the subject) or ignore (the email, the wallet) is not signed.
    for (const [args, named] of [
      [['--sub', 'a'.repeat(256)], '--sub'],
      [['--sub', 'alice', '--email', `${'a'.repeat(320)}@b.c`], '--email'],
      [['--sub', 'alice', '--wallet', '0x1234'], '--wallet'],
    ] as const) {
      const refused = start(['src/cli/token.ts', ...args], env)
      expect(await exitWithin(refused.proc, 10_000)).toBe(2)
      expect(await refused.stderr).toContain(named)
    }
  }, 30_000)

  test('the CLIs answer --help, and a wrong use or an unreachable database is one line naming why, no stack', async () => {
    const env = environment({ url: 'postgres://someone:secret@127.0.0.1:1/none' })
    const run = async (args: string[], overrides: Record<string, string> = {}) => {
      const cli = start(args, { ...env, ...overrides })
      const code = await exitWithin(cli.proc, 20_000)
      return { code, stdout: await cli.stdout, stderr: (await cli.stderr).trimEnd() }
    }
    for (const tool of [
      'src/cli/migrate.ts',
      'src/cli/token.ts',
      'src/cli/invoices-run.ts',
      'src/cli/connections-reseal.ts',
      'src/cli/actors-dead-letters.ts',
    ]) {
      const help = await run([tool, '--help'])
      expect(help.code, tool).toBe(0)
      expect(help.stdout).toStartWith('usage: npm run ')
      const wrong = await run([tool, '--no-such-option'])
      expect(wrong.code, tool).toBe(2)
      expect(wrong.stderr.split('\n')).toEqual([expect.stringContaining("Unknown option '--no-such-option' (--help shows the usage)")])
    }
    for (const tool of ['src/cli/migrate.ts', 'src/cli/invoices-run.ts', 'src/cli/connections-reseal.ts']) {
      const away = await run([tool], { CONNECTIONS_KEY: '0'.repeat(64) })
      expect(away.code, tool).toBe(1)
      expect(away.stderr).not.toContain('\n')
      expect(away.stderr).toContain('PostgreSQL is not reachable at DATABASE_URL=postgres://***@127.0.0.1:1/none')
      const badSetting = await run([tool], { PORT: 'abc' })
      expect(badSetting.code, tool).toBe(1)
      expect(badSetting.stderr).toEndWith(': invalid PORT: must be a whole number from 0 to 65535')
    }
  }, 60_000)

  test('a tool that needs the tables, on a database not migrated, says to migrate first in one line', async () => {
    const env = environment(await emptyDatabase(), { CONNECTIONS_KEY: '0'.repeat(64) })
    for (const tool of ['src/cli/invoices-run.ts', 'src/cli/connections-reseal.ts']) {
      const cli = start([tool], env)
      expect(await exitWithin(cli.proc, 20_000), tool).toBe(1)
      const count = readMigrations().length
      expect((await cli.stderr).trimEnd().split('\n')).toEqual([
        expect.stringMatching(new RegExp(`: the database at DATABASE_URL has 0 of this code's ${count} migrations: run \`npm run migrate\` first$`)),
      ])
    }
  }, 40_000)

  test('actors:dead-letters lists the dead letters with their errors; --send-again puts each back in its mailbox, marked due', async () => {
    const env = environment({ url: 'postgres://unused@127.0.0.1/unused' })
    const keys = createKeys(env.REDIS_PREFIX!)
    const redis = new Redis(env.REDIS_URL!)
    try {
      // As careful.ts moves one: the mailbox entry's fields, its id there, and the error.
      const fields = ['type', 'user.message', 'payload', '{"text":"hi"}', 'command', 'c-1', 'repeatable', '', 'hash', '', 'reply', 'r', 'ask', 'a']
      await redis.xadd(keys.actor('agent:a1').dead, '*', ...fields, 'entry', '1-0', 'error', 'no handler for agent command user.message')
      // Moved long ago (its id's time: 1970), past the two days applied commands are remembered.
      await redis.xadd(keys.actor('org:o1').dead, '1000-0', 'type', 'org.rename', 'payload', '{}', 'command', '', 'entry', '2-0', 'error', 'a bug')
      let stderr = ''
      const run = async (args: string[]) => {
        const cli = start(['src/cli/actors-dead-letters.ts', ...args], env)
        expect(await exitWithin(cli.proc, 20_000)).toBe(0)
        stderr = await cli.stderr
        return (await cli.stdout).trimEnd().split('\n')
      }
      const listed = await run([])
      expect(listed).toEqual([
        expect.stringMatching(/^\d{4}-\d\d-\d\dT.* agent:a1 user\.message: no handler for agent command user\.message$/),
        expect.stringMatching(/ org:o1 org\.rename: a bug$/),
        'actors:dead-letters: 2 dead letters',
      ])
      expect(stderr).toBe('')
      expect((await run(['--send-again', '--type', 'org.rename'])).at(-1)).toBe('actors:dead-letters: sent 1 again')
      expect(stderr).toStartWith('actors:dead-letters: 1 of them moved over two days ago, past the time their command ids are remembered')
      expect(await redis.xlen(keys.actor('org:o1').dead)).toBe(0)
      const [[, resent]] = (await redis.xrange(keys.actor('org:o1').mailbox, '-', '+')) as [[string, string[]]]
      // No command id of its own: the entry's id stands for it, as the runtime read it.
      expect(resent).toEqual(['type', 'org.rename', 'payload', '{}', 'command', '2-0', 'repeatable', '1', 'hash', '', 'reply', '', 'ask', ''])
      expect(await redis.zscore(keys.actorsDue, 'org:o1')).not.toBeNull()
      expect(await run([])).toEqual([expect.stringMatching(/ agent:a1 user\.message: /), 'actors:dead-letters: 1 dead letter'])
    } finally {
      redis.disconnect()
    }
  }, 40_000)

  test('migrate waiting for the lock says on stderr which session holds it, then applies once it is let go', async () => {
    const database = await emptyDatabase()
    const stray = createSql(database.url, { max: 1 })
    try {
      // A session left holding the migration lock (a stuck deploy, a stray psql).
      const held = await stray.reserve()
      const [row] = await held<{ pid: number }[]>`select pg_backend_pid() as pid, pg_advisory_lock(1634560359)`
      const cli = start(['src/cli/migrate.ts'], environment(database))
      // The CLI says so after 10 s of waiting; the lock is let go after that, and the run goes on.
      await Bun.sleep(11_500)
      await held`select pg_advisory_unlock(1634560359)`
      held.release()
      expect(await exitWithin(cli.proc, 20_000)).toBe(0)
      const stderr = await cli.stderr
      expect(stderr).not.toContain('before initialization')
      expect(stderr).toContain(`migrate: waiting 10 s for the migration lock, held by pid ${row!.pid} (agent-marketplace, idle`)
      expect(await cli.stdout).toStartWith('migrate: applied 00001_')
    } finally {
      await stray.end()
    }
  }, 40_000)

  test('a rollback: a database the next release migrated serves this code, which says so; one other code migrated stops the boot', async () => {
    const database = await emptyDatabase()
    const ours = readMigrations()
    const next = {
      id: ours.length + 1,
      name: `${String(ours.length + 1).padStart(5, '0')}_next_release.sql`,
      text: 'alter table users add column nickname text;',
    }
    const sql = createSql(database.url, { max: 1 })
    try {
      await migrate(sql, [...ours, next])
      const port = await freePort()
      const env = environment(database, { PORT: String(port) })
      const api = start(['src/main.ts', '--api'], env)
      await waitForHealth(port, api)
      expect((await fetch(`http://127.0.0.1:${port}/health/ready`)).status).toBe(200)
      expect(
        (await fetch(`http://127.0.0.1:${port}/v1/auth/me`, { headers: { authorization: `Bearer ${await userToken('rollback')}` } })).status,
      ).toBe(200)
      api.proc.kill('SIGTERM')
      expect(await exitWithin(api.proc, 15_000)).toBe(0)
      const warning = (await api.stdout).split('\n').find(line => line.includes('migrations this code does not'))
      expect(JSON.parse(warning!)).toMatchObject({ level: 'warn', migrations: [next.name] })
      const cli = start(['src/cli/migrate.ts'], env)
      expect(await exitWithin(cli.proc, 20_000)).toBe(0)
      expect(await cli.stdout).toBe(`migrate: up to date; the database also has ${next.name}, from newer code\n`)

      await sql`update migrations set name = '00002_another_branch.sql' where id = 2`
      expect(await refusedBoot(env)).toContain(`the database's migration 2 is 00002_another_branch.sql, where this code has ${ours[1]!.name}`)
    } finally {
      await sql.end()
    }
  }, 60_000)

  test('a REDIS_PREFIX another deployment’s database claimed stops the boot with one line; its own serves, however often it boots', async () => {
    const [ours, theirs] = [await emptyDatabase(), await emptyDatabase()]
    const port = await freePort()
    const env = environment(ours, { PORT: String(port) })
    await servesThenDrains(env)
    // Booted again on its own prefix: still its own.
    await servesThenDrains(env)

    // Staging beside production: another database, the same Redis and prefix.
    const sql = createSql(ours.url, { max: 1 })
    const [deployment] = await sql<{ id: string }[]>`select id from deployment`.finally(() => sql.end())
    const line = await refusedBoot({ ...env, DATABASE_URL: theirs.url })
    expect(line).toContain(
      `REDIS_PREFIX=${env.REDIS_PREFIX} holds the Redis state of another deployment (its database's deployment id is ${deployment!.id}`,
    )
    expect(line).toContain('give each deployment a REDIS_PREFIX of its own')
    const why = (record: string) => JSON.parse(record).error as string
    expect(why(await refusedBoot({ ...env, DATABASE_URL: theirs.url }, '--workers'))).toBe(why(line))
    // Both ran on the prefix before the claim (staging upgraded first, production refused): the way
    // out the line gives deletes the claim alone, not the mailboxes and queues the two share.
    const keys = createKeys(env.REDIS_PREFIX!)
    const redis = new Redis(env.REDIS_URL!)
    try {
      await redis.xadd(keys.actor('org:shared').mailbox, '*', 'type', 'org.rename', 'payload', '{}')
      const claim = why(line).match(/move the other to its own, then delete only the claim \(redis-cli -u "\$REDIS_URL" unlink '([^']+)'\)/)?.[1]
      expect(claim).toBe(keys.deployment)
      await redis.unlink(claim!)
      await servesThenDrains({ ...env, DATABASE_URL: theirs.url })
      expect(await redis.xlen(keys.actor('org:shared').mailbox)).toBe(1)
    } finally {
      redis.disconnect()
    }
    // With a prefix of its own it serves.
    await servesThenDrains(environment(theirs, { PORT: String(port) }))
  }, 60_000)

  test('a Redis back without its data is claimed again at once by the processes running on it; found claimed by another, they say so and serve on', async () => {
    const database = await emptyDatabase()
    const redis = await startRedisServer()
    const client = new Redis(redis.url)
    try {
      const port = await freePort()
      const env = environment(database, { PORT: String(port), REDIS_URL: redis.url })
      const claimKey = createKeys(env.REDIS_PREFIX!).deployment
      const service = start(['src/main.ts'], env)
      await waitForHealth(port, service)
      const ours = await client.get(claimKey)
      expect(ours).toMatch(/^[0-9a-f-]{36}$/)
      await redis.down({ keepData: false })
      await redis.up()
      await until(async () => (await client.get(claimKey).catch(() => null)) === ours, 10_000)
      // Reconnected while Redis holds writes (CLIENT PAUSE): the claim times out, which is no other's claim.
      await client.client('PAUSE', '4000', 'WRITE')
      await client.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
      await until(
        async () => (await fetch(`http://127.0.0.1:${port}/health/ready`)).status === 200 && (await client.set(`${claimKey}:probe`, '1')) === 'OK',
        15_000,
      )
      // Another deployment's claim, then the connections cut: each reconnection finds it, and says so.
      await client.set(claimKey, 'another-deployment')
      await client.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
      await until(async () => (await fetch(`http://127.0.0.1:${port}/health`)).status === 200, 10_000)
      service.proc.kill('SIGTERM')
      expect(await exitWithin(service.proc, 15_000)).toBe(0)
      const records = (await service.stdout).split('\n').filter(line => line.includes('"msg":"redis prefix not claimed again"'))
      expect(records.length).toBeGreaterThan(0)
      for (const record of records)
        expect(JSON.parse(record).error).toStartWith(`REDIS_PREFIX=${env.REDIS_PREFIX} holds the Redis state of another deployment`)
      expect(await client.get(claimKey)).toBe('another-deployment')
    } finally {
      client.disconnect()
      await redis.close()
    }
  }, 60_000)

  test('a second API process on a port the first holds stops with one line, rather than sharing its connections', async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const first = start(['src/main.ts', '--api'], environment(database, { PORT: String(port) }))
    await waitForHealth(port, first)
    const second = start(['src/main.ts', '--api'], environment(database, { PORT: String(port) }))
    expect(await exitWithin(second.proc, 20_000)).not.toBe(0)
    const lines = (await second.stderr).trimEnd().split('\n')
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain(`cannot listen on PORT=${port}`)
    expect(lines[0]).toContain(`port ${port} in use`)
    first.proc.kill('SIGTERM')
    expect(await exitWithin(first.proc, 15_000)).toBe(0)
  }, 45_000)

  test('a DATABASE_URL whose far end closes each connection, or refuses the pools’ startup parameters, stops the boot with one line', async () => {
    // A proxy whose database is away: upstream, the driver tried again for ever and the boot hung in
    // silence. A PgBouncer not told to ignore statement_timeout (or lock_timeout) answers every startup with an error.
    // Refused only where the startup sends it: the boot's first connection must send the pools' parameters.
    const refusing = (parameter: string): [(socket: Socket) => void, string] => [
      socket =>
        socket.once('data', startup =>
          startup.includes(parameter) ? socket.end(errorResponse('08P01', `unsupported startup parameter: ${parameter}`)) : socket.end(),
        ),
      `${parameter} (behind PgBouncer: add it to ignore_startup_parameters)`,
    ]
    const cases: [(socket: Socket) => void, string][] = [
      [socket => socket.end(), 'CONNECTION_CLOSED'],
      refusing('statement_timeout'),
      refusing('lock_timeout'),
    ]
    for (const [serve, says] of cases) {
      const proxy = createServer(serve).listen(0, '127.0.0.1')
      await new Promise(resolve => proxy.once('listening', resolve))
      try {
        const url = `postgres://someone:secret@127.0.0.1:${(proxy.address() as { port: number }).port}/none`
        const line = await refusedBoot(environment({ url }, { PORT: String(await freePort()) }))
        expect(line).toContain('PostgreSQL is not reachable at DATABASE_URL=postgres://***@127.0.0.1:')
        expect(line).toContain(says)
      } finally {
        proxy.close()
      }
    }
  }, 45_000)

  test('`start` serves a token from the CLI, and SIGTERM lets an open request finish before exiting 0', async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const env = environment(database, { PORT: String(port) })
    const service = start(['src/main.ts'], env)
    await waitForHealth(port, service)

    const cli = start(['src/cli/token.ts', '--sub', 'alice', '--email', 'a@b.c'], env)
    expect(await exitWithin(cli.proc, 10_000)).toBe(0)
    const token = (await cli.stdout).trim()
    expect(token).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+$/)
    const me = await fetch(`http://127.0.0.1:${port}/v1/auth/me`, { headers: { authorization: `Bearer ${token}` } })
    expect(me.status).toBe(200)
    expect(((await me.json()) as { data: unknown }).data).toMatchObject({ providerId: 'alice', email: 'a@b.c' })

    const body = JSON.stringify({ name: 'drain-bot', description: 'x'.repeat(2000) })
    const request = slowRequest(port, '/v1/participants', token, body)
    try {
      await request.opened
      await Bun.sleep(200)
      service.proc.kill('SIGTERM')
      await Bun.sleep(300)
      expect(service.proc.exitCode).toBeNull()
      const response = await request.finish()
      expect(response.status).toBe(201)
      expect(response.body.data).toMatchObject({ name: 'drain-bot' })
    } finally {
      request.destroy()
    }
    expect(await exitWithin(service.proc, 15_000)).toBe(0)
    expect(await service.stderr).toBe('')
  }, 30_000)

  test('SHUTDOWN_DELAY_MS: SIGTERM serves on, not ready, closing each connection it answers, then drains', async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const api = start(['src/main.ts', '--api'], environment(database, { PORT: String(port), SHUTDOWN_DELAY_MS: '1500' }))
    await waitForHealth(port, api)
    // One keep-alive connection, its requests one at a time; the answers' heads as text.
    const socket = connect(port, '127.0.0.1')
    await new Promise<void>(resolve => socket.on('connect', () => resolve()))
    let received = ''
    socket.on('data', chunk => (received += chunk.toString()))
    const closed = new Promise<number>(resolve => socket.on('close', () => resolve(Date.now())))
    const get = async (path: string) => {
      received = ''
      socket.write(`GET ${path} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n\r\n`)
      await until(async () => /\r\n\r\n.+/s.test(received), 5000)
      return received.split('\r\n\r\n')[0]!.toLowerCase()
    }
    try {
      expect(await get('/health/live')).not.toContain('connection: close')
      const stopping = Date.now()
      api.proc.kill('SIGTERM')
      await Bun.sleep(300)
      // Still listening, not ready, and each answer closes its connection.
      const ready = await fetch(`http://127.0.0.1:${port}/health/ready`)
      expect(ready.status).toBe(503)
      expect(ready.headers.get('connection')).toBe('close')
      expect(((await ready.json()) as { details: { path: string }[] }).details.map(d => d.path)).toContain('/draining')
      const live = await get('/health/live')
      expect(live).toStartWith('http/1.1 200')
      expect(live).toContain('connection: close')
      // Closed by the answer, not by the listener's close once the delay is over.
      expect((await closed) - stopping).toBeLessThan(1500)
      expect(await exitWithin(api.proc, 10_000)).toBe(0)
      expect(Date.now() - stopping).toBeGreaterThanOrEqual(1500)
    } finally {
      socket.destroy()
    }
  }, 30_000)

  test('SHUTDOWN_DELAY_MS: event streams, open before the signal or opened during the delay, end as it does; exit 0', async () => {
    // Ended at the signal, a stream's client came back (retry: 3000) to this process, still served
    // during the delay, and that stream held the drain until SHUTDOWN_TIMEOUT_MS: exit 1.
    const database = await emptyDatabase()
    const port = await freePort()
    const env = environment(database, { PORT: String(port), SHUTDOWN_DELAY_MS: '1500', SHUTDOWN_TIMEOUT_MS: '5000' })
    const api = start(['src/main.ts', '--api'], env)
    await waitForHealth(port, api)
    const open = async () => {
      const response = await fetch(`http://127.0.0.1:${port}/v1/events/chat`)
      expect(response.status).toBe(200)
      const reader = response.body!.getReader()
      // When the stream ended, or how it failed (a reset: the process gave up on its drain).
      const ended = (async () => {
        while (!(await reader.read()).done);
        return Date.now()
      })().catch((error: Error) => error.message)
      return { ended }
    }
    const before = await open()
    const stopping = Date.now()
    api.proc.kill('SIGTERM')
    await Bun.sleep(300)
    const during = await open()
    expect(await exitWithin(api.proc, 8000)).toBe(0)
    for (const ended of [await before.ended, await during.ended]) expect(Number(ended) - stopping).toBeGreaterThanOrEqual(1500)
    expect(await api.stdout).not.toContain('shutdown timed out')
  }, 30_000)

  test('with no workers running, SIGTERM answers a user’s message waiting on its agent 503 and exits 0', async () => {
    // The message waits 10 s for an answer no runtime gives; the default SHUTDOWN_TIMEOUT_MS outlasts it.
    const database = await emptyDatabase()
    const port = await freePort()
    const env = environment(database, { PORT: String(port) })
    const api = start(['src/main.ts', '--api'], env)
    await waitForHealth(port, api)
    const token = async (sub: string) => {
      const cli = start(['src/cli/token.ts', '--sub', sub, '--email', `${sub}@example.com`], env)
      expect(await exitWithin(cli.proc, 10_000)).toBe(0)
      return (await cli.stdout).trim()
    }
    const [alice, bob] = await Promise.all([token('alice'), token('bob')])
    const post = async (path: string, as: string, body: unknown) => {
      const response = await fetch(`http://127.0.0.1:${port}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${as}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      })
      return { status: response.status, body: (await response.json()) as any }
    }
    const agent = (await post('/v1/participants', alice, { name: 'no-workers-bot' })).body.data
    const plan = await post('/v1/billing/plans', alice, {
      participantId: agent.id,
      name: 'Basic',
      monthlyPriceCents: 500,
      includedProxyCalls: 100,
      overagePerCallCents: 1,
    })
    expect((await post('/v1/billing/subscriptions', bob, { planId: plan.body.data.id })).status).toBe(201)
    // Half the body before the signal, the rest after: the message's wait starts after the drain's.
    const body = JSON.stringify({ text: 'anyone there?' })
    const request = slowRequest(port, `/v1/conversations/${agent.id}/messages`, bob, body)
    try {
      await request.opened
      await Bun.sleep(200)
      api.proc.kill('SIGTERM')
      await Bun.sleep(300)
      const sent = Date.now()
      const answered = await request.finish()
      expect(answered.status).toBe(503)
      expect(answered.body.error).toBe('unavailable')
      expect(Date.now() - sent).toBeGreaterThanOrEqual(9_000)
    } finally {
      request.destroy()
    }
    expect(await exitWithin(api.proc, 10_000)).toBe(0)
    expect(await api.stdout).not.toContain('shutdown timed out')
  }, 40_000)

  test('a second SIGTERM while a request holds the drain exits 1 at once, saying so', async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const service = start(['src/main.ts'], environment(database, { PORT: String(port), SHUTDOWN_TIMEOUT_MS: '60000' }))
    await waitForHealth(port, service)
    expect(await exitOnSecondSigterm(service.proc, port, 3000)).toBe(1)
    expect(await service.stdout).toContain('SIGTERM while shutting down; exiting without waiting')
  }, 30_000)

  test.skipIf(!hasServerBinaries)(
    'after PostgreSQL restarts under queries in flight, SIGTERM exits 0 well within SHUTDOWN_TIMEOUT_MS',
    async () => {
      // A server of its own, as it is restarted; the API migrates its empty database on boot.
      const server = await startPostgresServer()
      servers.push(server)
      const port = await freePort()
      const shutdownTimeoutMs = 5000
      // No lock timeout: the sign-ins below wait on the lock until the restart, however long it takes to come.
      const api = start(
        ['src/main.ts', '--api'],
        environment({ url: server.url() }, { PORT: String(port), SHUTDOWN_TIMEOUT_MS: String(shutdownTimeoutMs), DATABASE_LOCK_TIMEOUT_MS: '0' }),
      )
      await waitForHealth(port, api)

      // Sign-ins of new users insert into users; a lock held on the table keeps those statements
      // running on the API's connections when the server goes down (as under load, deterministically).
      const admin = createSql(server.url(), { max: 2, applicationName: 'am-test-admin' })
      let release = () => {}
      let locked = () => {}
      const lockHeld = new Promise<void>(resolve => (locked = resolve))
      const held = admin
        .begin(async tx => {
          await tx`lock table users in access exclusive mode`
          locked()
          await new Promise<void>(resolve => (release = resolve))
        })
        .catch(() => {})
      await lockHeld
      const signInsDone = Promise.all(
        [1, 2, 3].map(async n => {
          const token = await userToken(`restart-${n}-${randomBytes(4).toString('hex')}`)
          return fetch(`http://127.0.0.1:${port}/v1/auth/me`, { headers: { authorization: `Bearer ${token}` } }).then(
            response => response.status,
            () => 0,
          )
        }),
      )
      try {
        await until(async () => {
          const [row] = await admin<{ waiting: number }[]>`
            select count(*)::int as waiting from pg_stat_activity
            where application_name = 'agent-marketplace' and wait_event_type = 'Lock'`
          return row!.waiting === 3
        }, 10_000)
        await server.restart()
      } finally {
        release()
        await held
        await admin.end({ timeout: 1 })
      }
      // The sign-ins in flight failed with the connections; nothing ran on those connections since.
      // Unpatched, the driver still counted their statements as running, and the pool's
      // `sql.end({ timeout: 5 })` in deps.close() waited out its timeout: past SHUTDOWN_TIMEOUT_MS.
      expect(await signInsDone).toEqual([503, 503, 503])

      const stopping = Date.now()
      api.proc.kill('SIGTERM')
      expect(await exitWithin(api.proc, shutdownTimeoutMs + 5000)).toBe(0)
      expect(Date.now() - stopping).toBeLessThan(shutdownTimeoutMs / 2)
      expect(await api.stdout).not.toContain('shutdown timed out')
    },
    45_000,
  )

  /** The four BullMQ workers wait for jobs on their blocking connections, as they do between jobs. */
  const workersWaiting = {
    async up({ redis }: { redis: { url: string } }) {
      const admin = new Redis(redis.url)
      await until(async () => ((await admin.client('LIST')) as string).split('cmd=bzpopmin').length - 1 >= 4, 15_000)
      admin.disconnect()
    },
    down: () => Bun.sleep(500),
  }

  test('with Redis gone, SIGTERM closes the workers and the connections and exits 0 within SHUTDOWN_TIMEOUT_MS', async () => {
    // API and workers in one process: the BullMQ workers, the actors, the relay and every connection.
    // Unpatched, the workers' connections waiting to reconnect never ended (redis/ioredis#2169), so
    // each BullMQ worker's close waited for Redis to come back: the drain timed out and exited 1.
    await drainWithRedisGone([], {}, workersWaiting)
  }, 45_000)

  test('with Redis paused (cut off by the network), SIGTERM closes the workers and the connections and exits 0 within SHUTDOWN_TIMEOUT_MS', async () => {
    // Every connection stays open, unanswered. Unfixed, the workers' close waited for their jobs'
    // commands and for the end of their blocking connections, which a silent Redis never sends: the
    // drain timed out. 12 s, under the default 15 s (the drain took 6.4 s here).
    await drainWithRedisGone([], {}, workersWaiting, { paused: true, shutdownTimeoutMs: 12_000 })
  }, 60_000)

  test('with Redis gone and a scrape read through it, SIGTERM of the API closes its queues connection and exits 0', async () => {
    const metricsPort = await freePort()
    const queuesRead = async () =>
      /^metrics_collector_up\{collector="queues"\} 1$/m.test(await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text())
    await drainWithRedisGone(
      ['--api'],
      { METRICS_PORT: String(metricsPort) },
      {
        // The queues (the producers' connection, which waits for Redis) were read once with Redis up.
        up: () => until(queuesRead, 15_000),
        // A scrape in the outage gives up on the queues; their commands stay in the connection's offline
        // queue, where they wait for Redis to come back. Unfixed, the connection's QUIT queued behind
        // them: the drain timed out and exited 1.
        down: async () => expect(await queuesRead()).toBe(false),
      },
    )
  }, 45_000)

  test('an unreachable Redis stops the boot with one stderr line naming REDIS_URL and how to install Redis', async () => {
    const database = await emptyDatabase()
    const env = environment(database, { PORT: String(await freePort()), REDIS_URL: 'redis://127.0.0.1:1' })
    const line = await refusedBoot(env)
    expect(line).toContain('REDIS_URL=redis://127.0.0.1:1')
    expect(line).toContain('apt-get install redis-server')
  }, 30_000)

  test('a Redis that evicts keys (maxmemory-policy other than noeviction) stops the boot with one stderr line', async () => {
    const database = await emptyDatabase()
    const redis = await startRedisServer()
    try {
      const admin = new Redis(redis.url)
      await admin.config('SET', 'maxmemory-policy', 'volatile-lru')
      admin.disconnect()
      const line = await refusedBoot(environment(database, { PORT: String(await freePort()), REDIS_URL: redis.url }))
      expect(line).toContain('evicts keys (maxmemory-policy volatile-lru)')
      expect(line).toContain('set maxmemory-policy noeviction')
    } finally {
      await redis.close()
    }
  }, 30_000)

  test('a Redis at its maxclients stops the boot with one stderr line saying so, not a broken pipe', async () => {
    const database = await emptyDatabase()
    const redis = await startRedisServer()
    // Another client holds every connection the Redis takes.
    const admin = new Redis(redis.url)
    try {
      await admin.config('SET', 'maxclients', '1')
      const line = await refusedBoot(environment(database, { PORT: String(await freePort()), REDIS_URL: redis.url }))
      expect(line).toContain(`Redis at REDIS_URL=${redis.url} refuses new connections: ERR max number of clients reached`)
    } finally {
      admin.disconnect()
      await redis.close()
    }
  }, 30_000)

  test('a REDIS_URL leading to a node of a Redis Cluster stops the boot of the API and of the workers with one stderr line', async () => {
    // A plain client on a Cluster node: the API came up ready and answered 500 (MOVED) for keys of the
    // other shards; the workers stopped on a CROSSSLOT.
    const cluster = await startRedisCluster()
    try {
      const database = await emptyDatabase()
      const url = `redis://127.0.0.1:${cluster.ports[0]}`
      for (const role of ['--api', '--workers']) {
        const line = await refusedBoot(environment(database, { PORT: String(await freePort()), REDIS_URL: url }), role)
        expect(line).toContain(`REDIS_URL=${url} is a node of a Redis Cluster (cluster_enabled:1), which the service does not support`)
      }
    } finally {
      await cluster.close()
    }
  }, 60_000)

  test('METRICS_PORT equal to PORT stops the boot of the API with one stderr line naming METRICS_PORT', async () => {
    const database = await emptyDatabase()
    const port = String(await freePort())
    const line = await refusedBoot(environment(database, { PORT: port, METRICS_PORT: port }))
    expect(line).toContain('invalid METRICS_PORT: must differ from PORT')
  }, 30_000)

  test('a database that refuses writes (read-only by default, as a hot standby) stops the boot with one line', async () => {
    const database = await emptyDatabase()
    const admin = createSql(database.url, { max: 1 })
    await admin.unsafe(`alter database ${database.name} set default_transaction_read_only = on`)
    await admin.end()
    // It used to hang for ever, silent: the migrator's pool never ended after the refused write; then
    // it stopped on that write (`cannot execute CREATE TABLE in a read-only transaction`), which a
    // boot with nothing to migrate does not make.
    const line = await refusedBoot(environment(database, { PORT: String(await freePort()) }))
    expect(line).toContain(`default_transaction_read_only = 'on' (set by alter database ${database.name}), and the service writes`)
  }, 30_000)

  test('a search_path with no schema that exists, or leading away from the tables, stops the boot and migrate with one line naming it', async () => {
    const empty = await emptyDatabase()
    const migrated = await createTestDatabase()
    databases.push(migrated)
    const admin = createSql(migrated.url, { max: 1 })
    try {
      await admin.unsafe(`alter database ${empty.name} set search_path = ''`)
      await admin.unsafe(`create schema other`)
      await admin.unsafe(`alter database ${migrated.name} set search_path = other, public`)
    } finally {
      await admin.end()
    }
    // Upstream, the first failed in the migrations with `no schema has been selected to create in`;
    // the second came up serving from a copy of every table made anew, empty, in schema other.
    const nowhere = JSON.parse(await refusedBoot(environment(empty, { PORT: String(await freePort()) }))).error
    expect(nowhere).toContain(`search_path = '""' (set by alter database ${empty.name}) names no schema that exists`)
    expect(nowhere).toContain(`alter database ${empty.name} reset search_path`)
    const away = JSON.parse(await refusedBoot(environment(migrated, { PORT: String(await freePort()) }))).error
    const says = `search_path = 'other, public' (set by alter database ${migrated.name}) leads to schema other, but the service's tables are in public`
    expect(away).toContain(says)
    expect(away).toContain(`alter database ${migrated.name} set search_path = public`)
    const cli = start(['src/cli/migrate.ts'], environment(migrated))
    expect(await exitWithin(cli.proc, 20_000)).toBe(1)
    expect(await cli.stderr).toContain(says)
  }, 45_000)

  test.skipIf(!hasServerBinaries)(
    'behind PgBouncer, a role’s own isolation (the startup parameter ignored) stops the boot with one line; reset, it serves',
    async () => {
      const server = await startPostgresServer()
      servers.push(server)
      // Through a PgBouncer of its own each time: its pooled server connections keep the role's settings of when they opened.
      const throughPgBouncer = async <T>(run: (url: string) => Promise<T>) => {
        const pooler = await startPgBouncer(server.port, 'transaction', 'app')
        return run(pooler.url('app')).finally(() => pooler.stop())
      }
      const admin = createSql(server.url(), { max: 1 })
      try {
        await admin.unsafe(`create role app login`)
        await admin.unsafe(`create database app owner app`)
        // PgBouncer tracks these two itself: they hold, and refuse nothing.
        await admin.unsafe(`alter role app set DateStyle = 'SQL, DMY'`)
        await admin.unsafe(`alter role app set TimeZone = 'Pacific/Chatham'`)
        // Upstream these came up, and racing subscriptions were 503s (serialization failures).
        for (const isolation of ['serializable', 'repeatable read']) {
          await admin.unsafe(`alter role app set default_transaction_isolation = '${isolation}'`)
          const line = await throughPgBouncer(
            async url => JSON.parse(await refusedBoot(environment({ url }, { PORT: String(await freePort()) }))).error,
          )
          expect(line).toContain(`default_transaction_isolation = '${isolation}' (set by alter role app), not the 'read committed' the service sends`)
          expect(line).toContain('alter role app reset default_transaction_isolation')
        }
        await admin.unsafe(`alter role app reset default_transaction_isolation`)
      } finally {
        await admin.end()
      }
      // Migrated straight to Postgres first, as docs/operations.md says of a transaction pool.
      const direct = createSql(`postgres://app@127.0.0.1:${server.port}/app`, { max: 1 })
      await migrate(direct).finally(() => direct.end())
      await throughPgBouncer(async url => {
        const port = await freePort()
        const service = start(['src/main.ts', '--api'], environment({ url }, { PORT: String(port) }))
        await waitForHealth(port, service)
        service.proc.kill('SIGTERM')
        expect(await exitWithin(service.proc, 15_000)).toBe(0)
      })
    },
    90_000,
  )

  test('PORT=0 listens on a port of the system’s choosing, and the boot’s own request (starting the HTTP client) reaches it', async () => {
    const database = await emptyDatabase()
    const metricsPort = await freePort()
    const service = start(['src/main.ts', '--api'], environment(database, { PORT: '0', METRICS_PORT: String(metricsPort) }))
    // The boot starts Bun's HTTP client with a request to itself (docs/limits.md); nothing else asks.
    const scraped = async () => (await fetch(`http://127.0.0.1:${metricsPort}/metrics`).catch(() => null))?.text()
    await until(async () => (await scraped())?.includes('route="/health/live",method="GET",status="200"') === true, 20_000)
    service.proc.kill('SIGTERM')
    expect(await exitWithin(service.proc, 20_000)).toBe(0)
  }, 30_000)

  test('production without an auth configuration stops the boot with one stderr line naming AUTH_JWT_SECRET', async () => {
    const database = await emptyDatabase()
    const env = environment(database, {
      PORT: String(await freePort()),
      NODE_ENV: 'production',
      AUTH_JWT_SECRET: undefined,
      CONNECTIONS_KEY: randomBytes(32).toString('hex'),
    })
    const line = await refusedBoot(env)
    expect(line).toContain('AUTH_JWT_SECRET')
  }, 30_000)

  test("a process warning (a library's deprecation) is a JSON record under the start scripts, not text on stderr", async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const preload = join(root, 'warn.ts')
    // Again and again, as the boot may register its listener after the first.
    await Bun.write(preload, `setInterval(() => process.emitWarning('a library is old', 'DeprecationWarning', 'DEP0999'), 100).unref()`)
    const env = environment(database, { PORT: String(port), BUN_OPTIONS: `--preload ${preload}` })
    const service = start(['run', '-s', 'start:api'], env, ['npm'])
    await waitForHealth(port, service)
    service.proc.kill('SIGTERM')
    expect(await exitWithin(service.proc, 20_000)).toBe(0)
    expect(await service.stderr).toBe('')
    const records = (await service.stdout)
      .trimEnd()
      .split('\n')
      .map(line => JSON.parse(line))
    expect(records).toContainEqual(expect.objectContaining({ msg: 'process warning', name: 'DeprecationWarning', error: 'a library is old' }))
  }, 30_000)

  test("SIGTERM while stdout's reader is behind: the shutdown's records are written out before the exit", async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const [preload, go] = [join(root, 'chatty.ts'), join(root, `read-${port}`)]
    // At the signal, 300 KB of records (process warnings): more than the pipe holds while nothing reads it.
    await Bun.write(preload, `process.on('SIGTERM', () => { for (let i = 0; i < 1000; i++) process.emitWarning('w'.repeat(300)) })`)
    const env = environment(database, { PORT: String(port), LOG_LEVEL: 'info', BUN_OPTIONS: `--preload ${preload}` })
    // stdout's reader reads nothing until the file `go` exists.
    const reader = `"$0" --no-warnings src/main.ts --api | { while [ ! -e ${go} ]; do sleep 0.05; done; cat; }`
    const service = start(['-c', reader, process.execPath], env, ['sh'])
    await waitForHealth(port, service)
    const bun = descendants(service.proc.pid).find(({ command }) => command.includes('src/main.ts'))!
    process.kill(bun.pid, 'SIGTERM')
    await Bun.sleep(500)
    await Bun.write(go, '')
    await exitWithin(service.proc, 10_000)
    const records = (await service.stdout)
      .trimEnd()
      .split('\n')
      .map(line => JSON.parse(line))
    expect(records.filter(record => record.msg === 'process warning')).toHaveLength(1000)
    expect(records.at(-1).msg).toBe('stopped')
  }, 30_000)

  test('production verifying JWTs by a JWKS without AUTH_AUDIENCE says at boot that tokens for any application pass', async () => {
    const database = await emptyDatabase()
    const port = await freePort()
    const env = environment(database, {
      PORT: String(port),
      NODE_ENV: 'production',
      AUTH_JWT_SECRET: undefined,
      // Read at the first token, not at boot.
      AUTH_JWKS_URL: 'http://127.0.0.1:1/jwks.json',
      CONNECTIONS_KEY: randomBytes(32).toString('hex'),
    })
    const service = start(['src/main.ts', '--api'], env)
    await waitForHealth(port, service)
    service.proc.kill('SIGTERM')
    expect(await exitWithin(service.proc, 20_000)).toBe(0)
    expect(await service.stdout).toContain('AUTH_AUDIENCE is not set')
  }, 30_000)
})
