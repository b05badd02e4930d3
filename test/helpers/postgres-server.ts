/**
 * A private PostgreSQL server for tests that restart or stop it (the driver's tests, the fault
 * suite): initdb into a temporary directory, trust auth, a spare loopback port; and streaming
 * replicas of it (pg_basebackup), to be cut off and promoted. As root, the binaries run as the
 * `postgres` OS user, since PostgreSQL refuses to run as root.
 */
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort } from './ports.ts'

export interface PostgresServer {
  port: number
  /** The URL of a database on this server (`postgres` unless named). */
  url(database?: string): string
  /**
   * `pg_ctl restart -m fast`; resolves with when it began and the first moment after it that the
   * server accepted connections again (polled from the start, not pg_ctl's own coarser wait).
   */
  restart(): Promise<{ downAt: number; upAt: number }>
  /** A streaming replica of this server (pg_basebackup -R), started on a port of its own. */
  startReplica(): Promise<PostgresReplica>
  /** The server's log. */
  output(): Promise<string>
  /** Stops the server (immediate mode) and removes its directory; safe to call twice. */
  stop(): Promise<void>
}

/** A hot standby: it replays what its primary writes until cut off, and becomes a primary of its own when promoted. */
export interface PostgresReplica extends PostgresServer {
  /** Waits until it has replayed everything its primary had written when called. */
  catchUp(): Promise<void>
  /**
   * Stops receiving WAL (its `primary_conninfo` emptied), as a replica that lags does: what the
   * primary writes from now on never reaches it. (Pausing replay is not that: a promotion replays
   * whatever WAL was received first.)
   */
  cutOff(): Promise<void>
  /** Ends recovery on a new timeline and waits until it takes writes. */
  promote(): Promise<void>
}

const tools = ['initdb', 'pg_ctl', 'pg_isready', 'pg_basebackup', 'psql', 'pg_dump', 'pg_restore']
const hasTools = (dir: string) => tools.every(tool => existsSync(join(dir, tool)))

/** The directory holding the server's programs and its clients' (`initdb`, `pg_ctl`, `pg_basebackup`, `psql`, `pg_dump`...): pg_ctl's on the PATH, else Debian's newest server's; null without. */
export function postgresBinaries(): string | null {
  const onPath = Bun.which('pg_ctl')
  if (onPath && hasTools(join(onPath, '..'))) return join(onPath, '..')
  const root = '/usr/lib/postgresql'
  if (!existsSync(root)) return null
  const versions = readdirSync(root).filter(name => hasTools(join(root, name, 'bin')))
  const newest = versions.sort((a, b) => Number(b) - Number(a))[0]
  return newest === undefined ? null : join(root, newest, 'bin')
}

export interface PostgresServerOptions {
  maxConnections?: number
  ipv6?: boolean
  /** The data directory (an empty one, owned by the server's OS user: a small disk's mount), instead of one under the temporary directory. */
  dataDir?: string
  /** Where the WAL goes (`initdb -X`), e.g. a small disk of its own, and the size of its segments in MB (`--wal-segsize`, default 16). */
  walDir?: string
  walSegmentMb?: number
  /** Server settings (`-c name=value`), e.g. `{ lc_messages: 'C.UTF-8' }`. */
  settings?: Record<string, string>
  /** The server's environment besides the caller's, e.g. `{ LANGUAGE: 'de' }` for its messages in German (with `lc_messages` other than C). */
  env?: Record<string, string>
}

/**
 * initdb and start a server (fsync off: nothing here crashes the machine) on a free port of
 * 127.0.0.1, and of ::1 too with `ipv6` (the port is found free on 127.0.0.1; PostgreSQL starts with a
 * warning in its log if another process holds it on ::1).
 */
export async function startPostgresServer(options: PostgresServerOptions = {}): Promise<PostgresServer> {
  const wal = [...(options.walDir ? ['-X', options.walDir] : []), ...(options.walSegmentMb ? ['--wal-segsize', String(options.walSegmentMb)] : [])]
  return startServer(options, (run, bin, data) =>
    run([join(bin, 'initdb'), '-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-sync', ...wal]),
  )
}

type Run = (args: string[]) => Promise<string>

/** Makes the data directory with `create`, then starts a server on it. */
async function startServer(
  options: PostgresServerOptions,
  create: (run: Run, bin: string, data: string) => Promise<unknown>,
): Promise<PostgresServer> {
  const bin = postgresBinaries()
  if (bin === null) throw new Error('initdb and pg_ctl not found (apt-get install postgresql)')
  const dir = mkdtempSync(join(tmpdir(), 'am-pg-'))
  const data = options.dataDir ?? join(dir, 'data')
  const log = join(dir, 'log')
  const asRoot = process.getuid?.() === 0
  if (asRoot) chownSync(dir, Number(await output(['id', '-u', 'postgres'])), Number(await output(['id', '-g', 'postgres'])))
  const command = (args: string[]) => (asRoot ? ['su', 'postgres', '-s', '/bin/sh', '-c', args.map(quote).join(' ')] : args)
  const run = (args: string[]) => output(command(args))

  // The last resort when the test process ends without stopping it (a failure, Ctrl-C).
  const onExit = () => {
    Bun.spawnSync(command([join(bin, 'pg_ctl'), '-D', data, '-m', 'immediate', 'stop']))
    rmSync(dir, { recursive: true, force: true })
  }
  process.once('exit', onExit)
  let stopped = false
  const stop = async () => {
    if (stopped) return
    stopped = true
    process.off('exit', onExit)
    if (existsSync(join(data, 'postmaster.pid'))) await run([join(bin, 'pg_ctl'), '-D', data, '-m', 'immediate', '-w', 'stop']).catch(() => {})
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    await create(run, bin, data)
    for (let attempt = 1; ; attempt++) {
      const port = await freePort()
      const extra = Object.entries(options.settings ?? {}).map(([name, value]) => ` -c ${name}=${value}`)
      const settings = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1${options.ipv6 ? ',::1' : ''} -c fsync=off -c max_connections=${options.maxConnections ?? 100}${extra.join('')}`
      const env = Object.entries(options.env ?? {}).map(([name, value]) => `${name}=${value}`)
      // -l: without it the server's output would hold pg_ctl's pipe open.
      const ctl = (...args: string[]) =>
        run([...(env.length > 0 ? ['env', ...env] : []), join(bin, 'pg_ctl'), '-D', data, '-l', log, '-o', settings, '-w', '-t', '30', ...args])
      const started = await ctl('start').then(
        () => true,
        // Another process may take the port between the check and the server's bind.
        error => (attempt < 3 ? false : Promise.reject(error)),
      )
      if (!started) continue
      const ready = async () => (await Bun.spawn([join(bin, 'pg_isready'), '-q', '-h', '127.0.0.1', '-p', String(port), '-t', '1']).exited) === 0
      const url = (database = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${database}`
      return {
        port,
        url,
        async restart() {
          const downAt = Date.now()
          let restarted = false
          const polled = (async () => {
            while (!restarted && (await ready())) await Bun.sleep(5)
            for (;;) {
              const began = Date.now()
              if (await ready()) return began
              await Bun.sleep(20)
            }
          })()
          await ctl('-m', 'fast', 'restart')
          restarted = true
          return { downAt, upAt: await polled }
        },
        startReplica: () => startReplica({ maxConnections: options.maxConnections, ipv6: options.ipv6 }, port, url()),
        output: () =>
          Bun.file(log)
            .text()
            .catch(() => ''),
        stop,
      }
    }
  } catch (error) {
    await stop()
    throw error
  }
}

async function startReplica(options: PostgresServerOptions, primaryPort: number, primaryUrl: string): Promise<PostgresReplica> {
  const server = await startServer(options, (run, bin, data) =>
    run([join(bin, 'pg_basebackup'), '-h', '127.0.0.1', '-p', String(primaryPort), '-U', 'postgres', '-D', data, '-R', '-X', 'stream', '--no-sync']),
  )
  const psql = (url: string, query: string) => output([join(postgresBinaries()!, 'psql'), url, '-Atc', query])
  const replayed = (lsn: string) => psql(server.url(), `select pg_last_wal_replay_lsn() >= '${lsn}'::pg_lsn`)
  return {
    ...server,
    async catchUp() {
      const lsn = await psql(primaryUrl, 'select pg_current_wal_lsn()')
      while ((await replayed(lsn)) !== 't') await Bun.sleep(20)
    },
    async cutOff() {
      await psql(server.url(), `alter system set primary_conninfo = ''`)
      await psql(server.url(), 'select pg_reload_conf()')
      while ((await psql(server.url(), 'select count(*) from pg_stat_wal_receiver')) !== '0') await Bun.sleep(20)
    },
    async promote() {
      await psql(server.url(), 'select pg_promote(true, 30)')
    },
  }
}

async function output(command: string[]): Promise<string> {
  const proc = Bun.spawn(command, { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  if (code !== 0) throw new Error(`${command.join(' ')} exited ${code}: ${stderr.trim() || stdout.trim()}`)
  return stdout.trim()
}

function quote(arg: string): string {
  return /^[\w./=:-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`
}
