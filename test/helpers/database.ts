/** Test databases: a migrated template per schema version, and a fresh clone of it per test file. */
import { createHash, randomBytes } from 'node:crypto'
import { createSql } from '../../src/db.ts'
import { migrate, readMigrations } from '../../src/migrate.ts'

export const adminUrl = process.env.TEST_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'

export function databaseUrl(name: string): string {
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  return url.toString()
}

/** Creates `am_tpl_<hash of the migrations>` once, under a lock, so parallel workers share it. */
export async function prepareTemplate(): Promise<string> {
  const migrations = readMigrations()
  const hash = createHash('sha256')
  for (const migration of migrations) hash.update(migration.name).update(migration.text)
  const name = `am_tpl_${hash.digest('hex').slice(0, 16)}`
  const admin = createSql(adminUrl, { max: 1 })
  try {
    await admin`select pg_advisory_lock(7366001)`
    const [exists] = await admin`select 1 from pg_database where datname = ${name}`
    if (!exists) {
      const building = `${name}_building`
      await admin`drop database if exists ${admin(building)}`
      await admin`create database ${admin(building)}`
      const sql = createSql(databaseUrl(building), { max: 1 })
      try {
        await migrate(sql, migrations)
      } finally {
        await sql.end()
      }
      await admin`alter database ${admin(building)} rename to ${admin(name)}`
    }
    await dropStaleTestDatabases(admin)
    await admin`select pg_advisory_unlock(7366001)`
    return name
  } finally {
    await admin.end()
  }
}

/** Test databases left behind by a killed run, an hour or more ago. */
async function dropStaleTestDatabases(admin: ReturnType<typeof createSql>) {
  const cutoff = Math.floor(Date.now() / 1000) - 3600
  const rows = await admin<{ datname: string }[]>`select datname from pg_database where datname like 'am_t\\_%'`
  for (const { datname } of rows) {
    const stamp = Number(datname.split('_')[2])
    if (Number.isFinite(stamp) && stamp < cutoff) await admin`drop database if exists ${admin(datname)} with (force)`
  }
}

export interface TestDatabase {
  name: string
  url: string
  drop(): Promise<void>
}

/** A fresh database cloned from the template (or empty, for migration tests; in `encoding`, with the C locale, implies empty). */
export async function createTestDatabase(options: { empty?: boolean; encoding?: string } = {}): Promise<TestDatabase> {
  const template = process.env.AM_TEST_TEMPLATE
  if (!template && !options.empty) throw new Error('the test preload did not prepare a template')
  const name = `am_t_${Math.floor(Date.now() / 1000)}_${randomBytes(6).toString('hex')}`
  const admin = createSql(adminUrl, { max: 1 })
  try {
    // A utility statement takes no parameters: the encoding is written into it (a test's own constant).
    if (options.encoding) await admin.unsafe(`create database ${name} template template0 encoding '${options.encoding}' locale 'C'`)
    else if (options.empty) await admin`create database ${admin(name)}`
    else await admin`create database ${admin(name)} template ${admin(template!)}`
  } finally {
    await admin.end()
  }
  return {
    name,
    url: databaseUrl(name),
    async drop() {
      const sql = createSql(adminUrl, { max: 1 })
      try {
        await sql`drop database if exists ${sql(name)} with (force)`
      } finally {
        await sql.end()
      }
    },
  }
}
