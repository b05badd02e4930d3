/**
 * One scenario's deployment of the service: a fresh database cloned from the migrated template, a
 * fresh Redis prefix, workers processes (one unless asked for more) and two API processes on fixed
 * spare ports, all configured by environment as in production.
 */
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSql } from '../../src/db.ts'
import { migrate } from '../../src/migrate.ts'
import { countRecordedBefore } from '../../src/metering/count.ts'
import type { PostgresServer } from '../../test/helpers/postgres-server.ts'
import type { RedisServer } from '../../test/helpers/redis-server.ts'
import { freePort } from '../../test/helpers/ports.ts'
import { running, startServiceProcess, waitAccepting, waitHealthy, type Role, type ServiceProcess } from './service-process.ts'

export const templateDatabase = 'fault_template'

/** Creates the template every scenario's database is cloned from, migrated by the project's migrator. */
export async function prepareTemplate(postgres: PostgresServer): Promise<void> {
  const admin = createSql(postgres.url('postgres'), { max: 1 })
  try {
    await admin`create database ${admin(templateDatabase)}`
  } finally {
    await admin.end()
  }
  const sql = createSql(postgres.url(templateDatabase), { max: 1 })
  try {
    await migrate(sql)
  } finally {
    await sql.end()
  }
}

export interface Deployment {
  name: string
  databaseUrl: string
  redisPrefix: string
  jwtSecret: string
  /** Where the processes' output is written, one file each. */
  logDir: string
  /** The base URLs of the API slots; a restarted API keeps its slot's port. */
  apiUrls: string[]
  /** The process now in each slot (`api-1`, `api-2`, `workers`, and `workers-2` on if asked for). */
  current(slot: string): ServiceProcess
  /** Every process started, replacements included, in order. */
  all: ServiceProcess[]
  /**
   * Kills a slot's process with SIGKILL, waits `downMs`, starts a replacement; resolves with when it
   * was killed and when the replacement was up (an API accepting connections, workers logging that
   * they started).
   */
  killAndRestart(slot: string, downMs: number): Promise<{ downAt: number; upAt: number }>
  close(): Promise<void>
}

export async function startDeployment(
  name: string,
  servers: { postgres: PostgresServer; redis: RedisServer },
  options: { proxyAllowedHosts: string; workers?: number; env?: Record<string, string> },
): Promise<Deployment> {
  const database = `fault_${name.replace(/[^a-z0-9]/g, '_')}_${randomBytes(4).toString('hex')}`
  const admin = createSql(servers.postgres.url('postgres'), { max: 1 })
  try {
    await admin`create database ${admin(database)} template ${admin(templateDatabase)}`
  } finally {
    await admin.end()
  }
  const logDir = mkdtempSync(join(tmpdir(), `am-faults-${name}-`))
  const redisPrefix = `fault:${randomBytes(4).toString('hex')}:`
  const jwtSecret = randomBytes(32).toString('hex')
  const base: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: logDir,
    NODE_ENV: 'production',
    DATABASE_URL: servers.postgres.url(database),
    REDIS_URL: servers.redis.url,
    REDIS_PREFIX: redisPrefix,
    AUTH_JWT_SECRET: jwtSecret,
    CONNECTIONS_KEY: randomBytes(32).toString('hex'),
    PROXY_ALLOWED_HOSTS: options.proxyAllowedHosts,
    LOG_LEVEL: 'info',
    DATA_DIR: logDir,
    // A killed worker's metering jobs come back after this, not after the default 30 s.
    QUEUE_LOCK_MS: '5000',
    SHUTDOWN_TIMEOUT_MS: '5000',
    // Each load user writes every 300 ms, past the default messagePost budget of a person.
    RATE_LIMITS: JSON.stringify({ messagePost: { capacity: 10_000, perSeconds: 1 } }),
    ...options.env,
  }
  const ports = [await freePort(), await freePort()]
  const workerSlots = Array.from({ length: options.workers ?? 1 }, (_, index) => (index === 0 ? 'workers' : `workers-${index + 1}`))
  const slots = new Map<string, { role: Role; env: Record<string, string>; process?: ServiceProcess; starts: number }>([
    ...workerSlots.map((slot): [string, { role: Role; env: Record<string, string>; starts: number }] => [
      slot,
      { role: 'workers', env: base, starts: 0 },
    ]),
    ...ports.map((port, index): [string, { role: Role; env: Record<string, string>; starts: number }] => [
      `api-${index + 1}`,
      { role: 'api', env: { ...base, PORT: String(port), SITE_URL: `http://127.0.0.1:${port}` }, starts: 0 },
    ]),
  ])
  const all: ServiceProcess[] = []

  const start = (slotName: string) => {
    const slot = slots.get(slotName)!
    slot.starts++
    const processName = slot.starts === 1 ? slotName : `${slotName}#${slot.starts}`
    const started = startServiceProcess(processName, slot.role, slot.env, join(logDir, `${processName}.log`))
    slot.process = started
    all.push(started)
    return started
  }
  const workersStarted = (service: ServiceProcess) => service.waitForLine(line => line.includes('"msg":"workers started"'), 30_000)

  const deployment: Deployment = {
    name,
    databaseUrl: servers.postgres.url(database),
    redisPrefix,
    jwtSecret,
    logDir,
    apiUrls: ports.map(port => `http://127.0.0.1:${port}`),
    current: slot => {
      const found = slots.get(slot)?.process
      if (!found) throw new Error(`no process in slot ${slot}`)
      return found
    },
    all,
    async killAndRestart(slotName, downMs) {
      const victim = deployment.current(slotName)
      victim.killedOnPurpose = true
      const downAt = Date.now()
      await victim.kill('SIGKILL')
      await Bun.sleep(Math.max(0, downAt + downMs - Date.now()))
      const replacement = start(slotName)
      const upAt = replacement.role === 'api' ? await waitAccepting(replacement) : await workersStarted(replacement)
      if (replacement.role === 'api') await waitHealthy(replacement)
      return { downAt, upAt }
    },
    async close() {
      // SIGTERM first (a drain, as in production), then SIGKILL for whatever does not finish.
      const live = all.filter(running)
      for (const service of live) service.proc.kill('SIGTERM')
      await Promise.race([Promise.all(live.map(service => service.proc.exited)), Bun.sleep(8000)])
      await Promise.all(live.map(service => service.kill('SIGKILL')))
      const sql = createSql(servers.postgres.url('postgres'), { max: 1 })
      try {
        await sql`drop database if exists ${sql(database)} with (force)`
      } catch {
        // the server is closed at the end of the file anyway
      } finally {
        await sql.end()
      }
    },
  }

  try {
    await Promise.all(workerSlots.map(slot => workersStarted(start(slot))))
    const apis = ['api-1', 'api-2'].map(start)
    await Promise.all(apis.map(api => waitHealthy(api)))
  } catch (error) {
    await deployment.close()
    throw error
  }
  return deployment
}

/** Removes a deployment's logs (kept when a scenario failed, for reading). */
export function removeLogs(deployment: Deployment): void {
  rmSync(deployment.logDir, { recursive: true, force: true })
}

/**
 * Counts the usage recorded before `before`, as maintenance would a minute later: for a fault that can
 * lose metering jobs (Redis losing its data, or refusing the job), whose calls the checks would
 * otherwise wait for past their patience.
 */
export async function countUsageRecordedBefore(deployment: Deployment, before: number): Promise<void> {
  const sql = createSql(deployment.databaseUrl, { max: 1 })
  try {
    await countRecordedBefore(sql, new Date(before), new Date())
  } finally {
    await sql.end()
  }
}
