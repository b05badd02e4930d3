/**
 * The service as operators run it against managed PostgreSQL and Redis: TLS only, a private CA
 * trusted through NODE_EXTRA_CA_CERTS, users whose passwords need URL-encoding, a Redis user limited
 * to the service's prefix. Skipped without openssl, PostgreSQL's server programs, or a redis-server
 * built with TLS.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSql } from '../src/db.ts'
import { reachDatabase } from '../src/reach-database.ts'
import { randomPrefix, userToken } from './helpers/context.ts'
import { postgresBinaries, startPostgresServer, type PostgresServer } from './helpers/postgres-server.ts'
import { deploymentEnv, exitWithin, processGroup } from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'
import { makeCertificates, requireTls, startTlsRedis, type TlsRedis } from './helpers/tls-servers.ts'

// Every character a URL's userinfo must have encoded.
const databasePassword = 'p@ss:w/rd%#?x'
const redisPassword = 'r@d:s/p%#?w'
const prefix = randomPrefix()

const certs = postgresBinaries() === null ? null : makeCertificates()
let postgres: PostgresServer | undefined
let redis: TlsRedis | null = null
if (certs) {
  redis = await startTlsRedis(certs, {
    // Only what the service needs: its own keys and channels, nothing @dangerous but INFO (BullMQ reads the version).
    service: [`>${redisPassword}`, `~${prefix}*`, `&${prefix}*`, '+@all', '-@dangerous', '+info'],
  })
  if (redis) {
    postgres = await startPostgresServer()
    await requireTls(postgres, certs)
    const admin = createSql(`${postgres.url()}?sslmode=require`, { max: 1 })
    await admin.unsafe(`create role service login password '${databasePassword}'`)
    await admin`create database marketplace owner service`
    await admin.end()
  }
}
const missing = !certs || !redis

const root = mkdtempSync(join(tmpdir(), 'am-tls-'))
const { start, killAll } = processGroup()

afterAll(async () => {
  await killAll()
  await redis?.close()
  await postgres?.stop()
  certs?.remove()
  rmSync(root, { recursive: true, force: true })
})

const databaseUrl = (password = databasePassword, sslmode = 'verify-full') =>
  `postgres://service:${encodeURIComponent(password)}@localhost:${postgres!.port}/marketplace?sslmode=${sslmode}`
const redisUrl = (password = redisPassword) => `rediss://service:${encodeURIComponent(password)}@localhost:${redis!.port}`
const env = (overrides: Record<string, string> = {}) =>
  deploymentEnv(root, prefix, {
    DATABASE_URL: databaseUrl(),
    REDIS_URL: redisUrl(),
    NODE_EXTRA_CA_CERTS: certs!.caFile,
    LOG_LEVEL: 'info',
    ...overrides,
  })

/** What must never be written: each password as it is and URL-encoded. */
function expectNoPasswords(output: string) {
  for (const password of [databasePassword, redisPassword]) {
    expect(output).not.toContain(password)
    expect(output).not.toContain(encodeURIComponent(password))
  }
}

async function bootFailure(overrides: Record<string, string>): Promise<string> {
  const service = start(['src/main.ts', '--api'], env({ PORT: String(await freePort()), ...overrides }))
  expect(await exitWithin(service.proc, 20_000)).toBe(1)
  expectNoPasswords((await service.stdout) + (await service.stderr))
  const lines = (await service.stderr).trimEnd().split('\n')
  expect(lines).toHaveLength(1)
  return JSON.parse(lines[0]!).error
}

describe.skipIf(missing)('a TLS-only PostgreSQL and Redis with a private CA and passwords', () => {
  test('serve the API, the workers and the CLIs, every connection over TLS as its user, no password logged', async () => {
    // Plain TCP is refused: whatever connects below does so over TLS.
    const plain = createSql(databaseUrl(databasePassword, 'disable'), { max: 1 })
    await expect(plain`select 1`).rejects.toThrow('no encryption')
    await plain.end()

    const port = await freePort()
    const service = start(['src/main.ts'], env({ PORT: String(port) }))
    const url = `http://127.0.0.1:${port}`
    const deadline = Date.now() + 30_000
    while (
      (await fetch(`${url}/health/ready`).then(
        r => r.status,
        () => 0,
      )) !== 200
    ) {
      if (service.proc.exitCode !== null) throw new Error(`exited ${service.proc.exitCode}: ${await service.stderr}`)
      if (Date.now() > deadline) throw new Error('not ready within 30 s')
      await Bun.sleep(100)
    }
    const call = async (path: string, auth: Record<string, string>, body?: unknown) => {
      const response = await fetch(`${url}${path}`, {
        method: body === undefined ? 'GET' : 'POST',
        headers: { ...auth, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      })
      return (await response.json()) as { data: any }
    }
    const alice = { authorization: `Bearer ${await userToken('alice')}` }
    const bob = { authorization: `Bearer ${await userToken('bob')}` }
    // The request pool, the actors (workers), the reply writer, the outbox relay.
    const agent = (await call('/v1/participants', alice, { name: 'tls-bot' })).data
    const plan = { participantId: agent.id, name: 'Basic', monthlyPriceCents: 500, includedProxyCalls: 100, overagePerCallCents: 1 }
    const planId = (await call('/v1/billing/plans', alice, plan)).data.id
    expect((await call('/v1/billing/subscriptions', bob, { planId })).data.planId).toBe(planId)
    expect((await call(`/v1/conversations/${agent.id}/messages`, bob, { text: 'hello' })).data.text).toBe('hello')
    const key = { 'x-api-key': agent.apiKey }
    const [pending] = (await call('/v1/agent/events', key)).data.pendingConversations
    expect((await call('/v1/agent/conversation-reply', key, { userId: pending.userId, text: 'hi' })).data.text).toBe('hi')
    expect((await call(`/v1/conversations/${agent.id}/messages`, bob)).data).toHaveLength(2)

    const cli = async (args: string[]) => {
      const run = start(args, env())
      expect(await exitWithin(run.proc, 20_000)).toBe(0)
      expectNoPasswords((await run.stdout) + (await run.stderr))
      return run.stdout
    }
    expect(await cli(['src/cli/migrate.ts'])).toContain('migrate: up to date')
    expect(await cli(['src/cli/invoices-run.ts'])).toContain('issued 0 invoices')

    // Every Redis connection of the service (the only clients but this one) is its user's; the port takes TLS only.
    const admin = redis!.admin()
    const clients = ((await admin.client('LIST')) as string).trim().split('\n')
    admin.disconnect()
    const others = clients.filter(line => !/ user=admin /.test(line))
    expect(others.length).toBeGreaterThanOrEqual(9)
    for (const line of others) expect(line).toContain(' user=service ')
    const names = others.map(line => / name=(\S*)/.exec(line)![1])
    for (const name of ['commands', 'subscriber', 'batches', 'queues', 'workers', 'actors', 'actors-blocking', 'dispatch', 'blog-queue']) {
      expect(names).toContain(`agent-marketplace:${name}`)
    }

    service.proc.kill('SIGTERM')
    expect(await exitWithin(service.proc, 20_000)).toBe(0)
    expectNoPasswords((await service.stdout) + (await service.stderr))
  }, 90_000)

  test('a wrong password or an untrusted CA stops the boot with one line saying why, without the password', async () => {
    expect(await bootFailure({ DATABASE_URL: databaseUrl('wrong') })).toContain('password authentication failed for user "service"')
    expect(await bootFailure({ NODE_EXTRA_CA_CERTS: certs!.otherCaFile })).toMatch(
      /^PostgreSQL is not reachable at DATABASE_URL=postgres:\/\/\*\*\*@.*certificate/,
    )
    // Redis's own reason, and that REDIS_URL's credentials are the fix (not starting a Redis, which
    // answered); an unverified database lets the boot reach Redis.
    const wrongPassword = await bootFailure({ REDIS_URL: redisUrl('wrong') })
    expect(wrongPassword).toMatch(/^Redis at REDIS_URL=rediss:\/\/\*\*\*@localhost:\d+ refuses its credentials \(WRONGPASS /)
    expect(wrongPassword).toContain('put the user and password it expects in REDIS_URL')
    expect(wrongPassword).not.toContain('apt-get install')
    const untrusted = await bootFailure({ NODE_EXTRA_CA_CERTS: certs!.otherCaFile, DATABASE_URL: databaseUrl(databasePassword, 'require') })
    expect(untrusted).toMatch(/^Redis is not reachable at REDIS_URL=rediss:\/\/\*\*\*@localhost:\d+ \(.*certificate/)
  }, 60_000)
})

describe.skipIf(postgresBinaries() === null)('DATABASE_URL asking TLS of a PostgreSQL without it', () => {
  test('stops the boot with one line saying so, not only that the TLS connection broke off', async () => {
    const plain = await startPostgresServer()
    try {
      const url = `${plain.url()}?sslmode=require`
      const error = await reachDatabase(url).catch((e: Error) => e)
      expect((error as Error).message).toStartWith(`PostgreSQL is not reachable at DATABASE_URL=`)
      expect((error as Error).message).toContain('what a server that takes no TLS does: turn ssl on there, or drop sslmode from DATABASE_URL')
    } finally {
      await plain.stop()
    }
  }, 60_000)
})
