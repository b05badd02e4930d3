/** The service's output through Redis and PostgreSQL outages: every line one JSON object, no flood, serving after. */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { deleteKeys, randomPrefix, redisUrl, testJwtSecret, userToken } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { exitWithin, processGroup, type Started } from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'
import { startRedisServer, type RedisServer } from './helpers/redis-server.ts'
import { startHeldProxy, type HeldProxy } from './helpers/held-proxy.ts'
import { until } from './helpers/until.ts'
import { maxLineBytes } from '../src/log.ts'

const root = mkdtempSync(join(tmpdir(), 'am-outage-'))
const { start, killAll } = processGroup()
const cleanups: (() => Promise<void>)[] = []

afterAll(async () => {
  await killAll()
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => {})
  rmSync(root, { recursive: true, force: true })
})

async function database(): Promise<TestDatabase> {
  const created = await createTestDatabase()
  cleanups.push(() => created.drop())
  return created
}

/** The all-in-one service (API, workers, actor runtime), at `info` so that every kind of line shows. */
async function service(databaseUrl: string, redis: string): Promise<{ started: Started; base: string }> {
  const prefix = randomPrefix()
  cleanups.push(() => deleteKeys(prefix))
  const port = await freePort()
  const started = start(['src/main.ts'], {
    PATH: process.env.PATH!,
    HOME: process.env.HOME ?? root,
    DATABASE_URL: databaseUrl,
    REDIS_URL: redis,
    REDIS_PREFIX: prefix,
    AUTH_JWT_SECRET: testJwtSecret,
    LOG_LEVEL: 'info',
    NODE_ENV: 'development',
    PORT: String(port),
    DATA_DIR: mkdtempSync(join(root, 'data-')),
  })
  const base = `http://127.0.0.1:${port}`
  await until(async () => {
    if (started.proc.exitCode !== null) throw new Error(`exited with ${started.proc.exitCode}: ${await started.stderr}`)
    return (await health(base)) === 200
  }, 20_000)
  return { started, base }
}

const health = (base: string) =>
  fetch(`${base}/health`)
    .then(response => response.status)
    .catch(() => 0)

/** Requests that touch Redis and Postgres: a user's first token, a chat message (rate limit, pub/sub), the chat. */
async function traffic(base: string, token: string): Promise<number[]> {
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' }
  const statuses: number[] = []
  for (const [method, path, body] of [
    ['GET', '/v1/auth/me'],
    ['POST', '/v1/chat/messages', JSON.stringify({ text: 'still here' })],
    ['GET', '/v1/chat/messages'],
    ['GET', '/health'],
  ] as const) {
    const response = await fetch(`${base}${path}`, { method, headers, body }).catch(() => null)
    statuses.push(response?.status ?? 0)
    await response?.arrayBuffer()
  }
  return statuses
}

/** Every line the process wrote, stdout and stderr, each expected to be one JSON object. */
async function linesOf(started: Started): Promise<{ stream: string; line: string }[]> {
  const [stdout, stderr] = await Promise.all([started.stdout, started.stderr])
  return [...stdout.split('\n').map(line => ({ stream: 'stdout', line })), ...stderr.split('\n').map(line => ({ stream: 'stderr', line }))].filter(
    ({ line }) => line !== '',
  )
}

/**
 * Every line one record of src/log.ts (an object with an ISO time, a level and a message), short
 * enough for a collector to keep whole (Docker and CRI split lines at 16 KiB), and holding none of
 * `secrets` (a caller's credential, a password in a URL).
 */
function expectJsonLines(lines: { stream: string; line: string }[], secrets: string[] = []) {
  const bad = lines.filter(({ line }) => {
    try {
      const parsed = JSON.parse(line)
      return (
        parsed === null ||
        typeof parsed !== 'object' ||
        Array.isArray(parsed) ||
        Number.isNaN(Date.parse(parsed.time)) ||
        !['debug', 'info', 'warn', 'error'].includes(parsed.level) ||
        typeof parsed.msg !== 'string' ||
        Buffer.byteLength(`${line}\n`) > maxLineBytes ||
        secrets.some(secret => line.includes(secret))
      )
    } catch {
      return true
    }
  })
  expect(bad.slice(0, 20)).toEqual([])
}

describe('through outages', () => {
  test('Redis stopped for a few seconds and started again: every line JSON, no flood, serving after', async () => {
    const redis: RedisServer = await startRedisServer()
    cleanups.push(() => redis.close())
    const { started, base } = await service((await database()).url, redis.url)
    const token = await userToken('outage-alice', { email: 'alice@example.com' })
    expect(await traffic(base, token)).toEqual([200, 201, 200, 200])

    const outage = await redis.down({ keepData: false })
    while (Date.now() - outage < 4000) {
      await traffic(base, token)
      await Bun.sleep(200)
    }
    expect({ health: await health(base), exitCode: started.proc.exitCode }).toEqual({ health: 503, exitCode: null })
    await redis.up()

    await until(async () => (await health(base)) === 200, 20_000)
    // The new Redis is empty: the chat's rate limit starts afresh, and pub/sub is listened to again.
    expect(await traffic(base, token)).toEqual([200, 201, 200, 200])

    started.proc.kill('SIGTERM')
    expect(await exitWithin(started.proc, 15_000)).toBe(0)
    const lines = await linesOf(started)
    expectJsonLines(lines, [token])
    const records = lines.map(({ line }) => JSON.parse(line) as { level: string; msg: string; connection?: string })
    // The outage is in the log once per connection, not once per reconnection attempt: each
    // connection that went down says so once, and once that it is back.
    const said = (msg: string) => records.filter(record => record.msg === msg).map(record => record.connection)
    expect(said('redis connection lost').length).toBeGreaterThan(0)
    expect(said('redis connection back').sort()).toEqual(said('redis connection lost').sort())
    expect(records.filter(record => record.level === 'warn' || record.level === 'error').length).toBeLessThan(60)
  }, 60_000)

  test('Redis that stops answering: requests that need it are 503 within seconds, not held for the pause', async () => {
    const redis: RedisServer = await startRedisServer()
    cleanups.push(() => redis.close())
    const { started, base } = await service((await database()).url, redis.url)
    const token = await userToken('outage-carol', { email: 'carol@example.com' })
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' }
    const agent = await fetch(`${base}/v1/participants`, { method: 'POST', headers, body: JSON.stringify({ name: 'paused-bot' }) })
    const apiKey = ((await agent.json()) as { data: { apiKey: string } }).data.apiKey
    const calls = [
      () => fetch(`${base}/v1/chat/messages`, { method: 'POST', headers, body: JSON.stringify({ text: 'anyone?' }) }),
      () => fetch(`${base}/v1/auth/sse-token`, { method: 'POST', headers }),
      () => fetch(`${base}/v1/agent/events`, { headers: { 'x-api-key': apiKey } }),
    ]
    expect(await Promise.all(calls.map(async call => (await call()).status))).toEqual([201, 200, 200])

    redis.pause()
    try {
      // The poll may answer from the process's memory; anything that needs Redis is 503 in the envelope.
      const answered = await Promise.all(
        calls.map(async call => {
          const began = Date.now()
          const response = await call().catch(() => null)
          const body = response ? ((await response.json()) as { error?: string }) : null
          return { status: response?.status ?? 0, error: body?.error, ms: Date.now() - began }
        }),
      )
      for (const answer of answered) {
        expect(answer.status === 503 ? answer.error : answer.status).toBe(answer.status === 503 ? 'unavailable' : 200)
        expect(answer.ms).toBeLessThan(10_000)
      }
      expect(answered[0]!.status).toBe(503)
      expect(answered[1]!.status).toBe(503)
      // Long enough for the actor runtime's claims to time out round after round.
      await Bun.sleep(8000)
    } finally {
      redis.resume()
    }
    await until(async () => (await health(base)) === 200, 20_000)
    expect(await Promise.all(calls.map(async call => (await call()).status))).toEqual([201, 200, 200])
    started.proc.kill('SIGTERM')
    expect(await exitWithin(started.proc, 15_000)).toBe(0)
    const lines = await linesOf(started)
    expectJsonLines(lines, [token, apiKey])
    // Said once, then at most once a minute, not every round.
    const claims = lines.filter(({ line }) => (JSON.parse(line) as { msg: string }).msg === 'actor claim failed; retrying')
    expect(claims.length).toBe(1)
  }, 60_000)

  test('PostgreSQL cut off for a few seconds and back: every line JSON, serving after', async () => {
    const db = await database()
    const proxy: HeldProxy = await startHeldProxy(db.url)
    cleanups.push(() => proxy.close())
    const through = new URL(db.url)
    through.port = new URL(proxy.url).port
    // A password in the URL (trust auth ignores it) must never reach the log.
    through.password = 'never-logged-password'
    const { started, base } = await service(through.toString(), redisUrl)
    const token = await userToken('outage-bob', { email: 'bob@example.com' })
    expect(await traffic(base, token)).toEqual([200, 201, 200, 200])

    await proxy.stop()
    const outage = Date.now()
    while (Date.now() - outage < 4000) {
      await traffic(base, token)
      await Bun.sleep(200)
    }
    // Up all along, answering 503 (a crash would show here as no answer and an exit code).
    expect({ health: await health(base), exitCode: started.proc.exitCode }).toEqual({ health: 503, exitCode: null })
    await proxy.restart()

    await until(async () => (await health(base)) === 200, 20_000)
    expect(await traffic(base, token)).toEqual([200, 201, 200, 200])

    started.proc.kill('SIGTERM')
    expect(await exitWithin(started.proc, 15_000)).toBe(0)
    expectJsonLines(await linesOf(started), [token, 'never-logged-password'])
  }, 60_000)
})
