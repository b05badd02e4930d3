/** Forward-only migrations: numbered files in sql/, all pending ones in one transaction under a lock. */
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Sql } from './db.ts'

export const migrationsDir = join(import.meta.dir, '..', 'sql')

// Any constant works; it only has to be the same in every process that migrates this database.
const lockId = 0x616d6967 // "amig"

export interface Migration {
  id: number
  name: string
  text: string
}

export function readMigrations(dir = migrationsDir): Migration[] {
  const files = readdirSync(dir)
    .filter(file => /^\d{5}_[a-z0-9_-]+\.sql$/.test(file))
    .sort()
  return files.map((file, index) => {
    const id = Number(file.slice(0, 5))
    if (id !== index + 1) throw new Error(`migration ${file} breaks the sequence: expected number ${index + 1}`)
    return { id, name: file, text: readFileSync(join(dir, file), 'utf8') }
  })
}

/**
 * Applies every pending migration, or none. Two processes starting together both succeed: the
 * second waits for the lock, then finds nothing left to do.
 *
 * @example
 * const applied = await migrate(sql)
 */
export async function migrate(sql: Sql, migrations = readMigrations()): Promise<string[]> {
  return sql.begin(async tx => {
    await tx`select pg_advisory_xact_lock(${lockId})`
    await tx`
      create table if not exists migrations (
        id integer primary key,
        name text not null,
        applied_at timestamptz not null default now()
      )
    `
    const [row] = await tx<{ max: number }[]>`select coalesce(max(id), 0)::int as max from migrations`
    const current = row?.max ?? 0
    if (current > migrations.length) {
      throw new Error(`database is at migration ${current}, newer than this code (${migrations.length})`)
    }
    const pending = migrations.slice(current)
    for (const migration of pending) {
      await tx.unsafe(migration.text)
      await tx`insert into migrations (id, name) values (${migration.id}, ${migration.name})`
    }
    return pending.map(migration => migration.name)
  })
}
