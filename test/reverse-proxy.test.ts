/**
 * The API behind nginx, as a deployment runs it: an upstream keep-alive pool, the proxy settings
 * docs/operations.md gives, real API processes. nginx is installed when missing (test/helpers/nginx.ts).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { deleteKeys, randomPrefix } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { startNginx, type Nginx } from './helpers/nginx.ts'
import { deploymentEnv, processGroup, type Started } from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'
import { until } from './helpers/until.ts'

const root = mkdtempSync(join(tmpdir(), 'am-reverse-proxy-'))
const { start, killAll } = processGroup()
const databases: TestDatabase[] = []
const prefixes: string[] = []
const proxies: Nginx[] = []

afterAll(async () => {
  await Promise.all(proxies.map(proxy => proxy.stop()))
  await killAll()
  await Promise.all(databases.map(database => database.drop()))
  await Promise.all(prefixes.map(prefix => deleteKeys(prefix)))
  rmSync(root, { recursive: true, force: true })
})

interface Api {
  port: number
  started: Started
  /** Its environment, to start it again as it was. */
  env: Record<string, string>
}

/** A database and a Redis prefix of their own, for API processes that share them (`deployment(...)` each). */
async function deployment(): Promise<(overrides?: Record<string, string>) => Record<string, string>> {
  const database = await createTestDatabase()
  databases.push(database)
  const prefix = randomPrefix()
  prefixes.push(prefix)
  return (overrides = {}) => deploymentEnv(root, prefix, { DATABASE_URL: database.url, ...overrides })
}

/** An API process (`bun src/main.ts --api`) on a spare port (or `env`'s), once it answers /health/ready. */
async function startApi(env: Record<string, string>): Promise<Api> {
  const port = env.PORT ? Number(env.PORT) : await freePort()
  const full = { ...env, PORT: String(port) }
  const started = start(['src/main.ts', '--api'], full)
  await until(async () => {
    if (started.proc.exitCode !== null) throw new Error(`the API exited with ${started.proc.exitCode}: ${await started.stderr}`)
    return (await fetch(`http://127.0.0.1:${port}/health/ready`).catch(() => undefined))?.status === 200
  }, 30_000)
  return { port, started, env: full }
}

/**
 * Closed TCP connections to or from `port`, by who holds them in TIME_WAIT: the side that closed
 * first, for 60 s after. The API's side is in /proc/net/tcp6 (it listens on `::`), nginx's in tcp.
 */
function closedFirstBy(port: number): { server: number; client: number } {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0')
  const rows = ['/proc/net/tcp', '/proc/net/tcp6'].flatMap(file => readFileSync(file, 'utf8').split('\n').slice(1))
  const counts = { server: 0, client: 0 }
  for (const row of rows) {
    const [, local, remote, state] = row.trim().split(/\s+/)
    if (state !== '06') continue
    if (local?.endsWith(`:${hexPort}`)) counts.server++
    else if (remote?.endsWith(`:${hexPort}`)) counts.client++
  }
  return counts
}

describe('behind nginx', () => {
  test(
    'idle upstream connections are closed by nginx at its keepalive_timeout (60 s), never first by the API: no 502 from a request sent as the API closes one',
    async () => {
      const { port } = await startApi((await deployment())())
      const proxy = await startNginx([port])
      proxies.push(proxy)
      // Fills nginx's pool: each of these concurrent requests takes a connection of its own, kept idle after.
      const burst = () =>
        Promise.all(
          Array.from({ length: 20 }, () =>
            fetch(`${proxy.url}/v1/participants`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' }).then(
              response => response.status,
            ),
          ),
        )
      expect(new Set(await burst())).toEqual(new Set([400]))
      // Past nginx's 60 s: with the API's old 30 s, the API had closed each one first, and a request
      // nginx sent on one as it closed was answered 502 (Bun closes idle connections in 4 s ticks,
      // all at once: 50 of 3,150 POSTs sent around such a tick were 502).
      await Bun.sleep(62_000)
      const closed = closedFirstBy(port)
      expect(closed.server).toBe(0)
      expect(closed.client).toBeGreaterThan(0)
      expect(new Set(await burst())).toEqual(new Set([400]))
      expect(proxy.errorLog()).not.toContain('upstream prematurely closed')
    },
    { timeout: 120_000 },
  )
})
