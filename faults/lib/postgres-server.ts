/**
 * A PostgreSQL of the suite's own: Debian's binaries run as the `postgres` OS user (we are root),
 * the cluster in a temporary directory, trust auth, a spare port; restarted with `pg_ctl restart -m fast`.
 */
import { chownSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { firstSuccess, postgresIsReady } from './accepting.ts'
import { onExit, run } from './children.ts'
import { freePort } from './ports.ts'

const bin = '/usr/lib/postgresql/15/bin'

export interface PostgresServer {
  port: number
  /** The URL of one database on this server. */
  url(database: string): string
  /** `pg_ctl restart -m fast`; resolves with when it began and when pg_isready first passed after. */
  restart(): Promise<{ downAt: number; upAt: number }>
  /** The server's log file. */
  output(): Promise<string>
  close(): Promise<void>
}

const quote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`

/** Runs a command line as the postgres OS user. */
function asPostgres(command: string[]) {
  return run(['su', 'postgres', '-s', '/bin/sh', '-c', command.map(quote).join(' ')])
}

export async function startPostgresServer(): Promise<PostgresServer> {
  const dir = mkdtempSync(join(tmpdir(), 'am-faults-pg-'))
  const users = await run(['id', '-u', 'postgres'])
  const groups = await run(['id', '-g', 'postgres'])
  chownSync(dir, Number(users.output), Number(groups.output))
  const data = join(dir, 'data')
  const logFile = join(dir, 'server.log')
  const port = await freePort()

  await asPostgres([`${bin}/initdb`, '-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync', '--no-instructions'])
  const unregister = onExit(() => {
    Bun.spawnSync(['su', 'postgres', '-s', '/bin/sh', '-c', `${bin}/pg_ctl -D ${quote(data)} -m immediate stop`])
    rmSync(dir, { recursive: true, force: true })
  })
  // fsync off: nothing here crashes the machine, and a fast shutdown writes everything out itself.
  const options = [`-p ${port}`, '-c listen_addresses=127.0.0.1', `-k ${dir}`, '-c max_connections=300', '-c fsync=off'].join(' ')
  await asPostgres([`${bin}/pg_ctl`, '-D', data, '-l', logFile, '-o', options, '-w', '-t', '30', 'start'])
  await firstSuccess(() => postgresIsReady(port), `postgres on port ${port}`, 15_000)

  return {
    port,
    url: database => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async restart() {
      const downAt = Date.now()
      // Polled from the start, so the first moment it accepts again is seen, not pg_ctl's own wait.
      let restarted = false
      const polled = firstSuccess(async () => restarted || !(await postgresIsReady(port)), 'postgres going down', 30_000, 5).then(
        () => firstSuccess(() => postgresIsReady(port), `postgres on port ${port}`, 30_000),
      )
      // -l again: without it the new server's output would hold this pipe open.
      await asPostgres([`${bin}/pg_ctl`, '-D', data, '-l', logFile, '-m', 'fast', '-w', '-t', '30', 'restart'])
      restarted = true
      const upAt = await polled
      return { downAt, upAt }
    },
    output: () => Bun.file(logFile).text().catch(() => ''),
    async close() {
      await asPostgres([`${bin}/pg_ctl`, '-D', data, '-m', 'immediate', 'stop']).catch(() => {})
      unregister()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
