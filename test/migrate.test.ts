import { afterAll, afterEach, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSql, type Sql } from '../src/db.ts'
import { migrate, readMigrations } from '../src/migrate.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'

const root = mkdtempSync(join(tmpdir(), 'am-migrate-'))
const databases: TestDatabase[] = []
const pools: Sql[] = []

afterEach(async () => {
  await Promise.all(pools.splice(0).map(sql => sql.end()))
})
afterAll(async () => {
  await Promise.all(databases.map(database => database.drop()))
  rmSync(root, { recursive: true, force: true })
})

async function emptyDatabase(): Promise<TestDatabase> {
  const database = await createTestDatabase({ empty: true })
  databases.push(database)
  return database
}

function connect(database: TestDatabase): Sql {
  const sql = createSql(database.url, { max: 1 })
  pools.push(sql)
  return sql
}

/** A migrations folder holding exactly these files. */
function folder(files: Record<string, string>): string {
  const dir = mkdtempSync(join(root, 'sql-'))
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text)
  return dir
}

async function tableExists(sql: Sql, name: string): Promise<boolean> {
  const [row] = await sql<{ exists: boolean }[]>`select to_regclass(${name}) is not null as exists`
  return row!.exists
}

describe('migrate', () => {
  test('applies every file to an empty database and records each in migrations', async () => {
    const sql = connect(await emptyDatabase())
    const files = readMigrations()
    expect(files.length).toBeGreaterThan(0)
    const applied = await migrate(sql)
    expect(applied).toEqual(files.map(file => file.name))
    const rows = await sql<{ id: number; name: string }[]>`select id, name from migrations order by id`
    expect([...rows]).toEqual(files.map(file => ({ id: file.id, name: file.name })))
    expect(await tableExists(sql, 'participants')).toBe(true)
  })

  test('a second run applies nothing', async () => {
    const sql = connect(await emptyDatabase())
    await migrate(sql)
    expect(await migrate(sql)).toEqual([])
    const [row] = await sql<{ count: number }[]>`select count(*)::int as count from migrations`
    expect(row!.count).toBe(readMigrations().length)
  })

  test('two runs at once on separate connections both succeed and apply each file once', async () => {
    const database = await emptyDatabase()
    const [one, two] = [connect(database), connect(database)]
    const results = await Promise.all([migrate(one), migrate(two)])
    const names = readMigrations().map(file => file.name)
    expect(results.flat().sort()).toEqual(names.sort())
    expect(results.some(applied => applied.length === 0)).toBe(true)
    const rows = await one<{ id: number }[]>`select id from migrations order by id`
    expect(rows.map(row => row.id)).toEqual(readMigrations().map(file => file.id))
  })

  test('a failing migration leaves nothing applied, not even the ones before it', async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({
      '00001_good.sql': 'create table good (id integer primary key);',
      '00002_broken.sql': 'create table broken (id integer primary key,);',
    })
    const migrations = readMigrations(dir)
    expect(migrations.map(migration => migration.id)).toEqual([1, 2])
    await expect(migrate(sql, migrations)).rejects.toThrow('syntax error')
    expect(await tableExists(sql, 'good')).toBe(false)
    expect(await tableExists(sql, 'migrations')).toBe(false)
  })

  test('refuses a database that is ahead of the code', async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({ '00001_a.sql': 'create table a (id integer);', '00002_b.sql': 'create table b (id integer);' })
    await migrate(sql, readMigrations(dir))
    await expect(migrate(sql, readMigrations(dir).slice(0, 1))).rejects.toThrow('newer than this code')
  })
})

describe('readMigrations', () => {
  test('reads numbered files in order and ignores other files', () => {
    const dir = folder({
      '00002_b.sql': 'select 2;',
      '00001_a.sql': 'select 1;',
      'README.md': 'not a migration',
      'draft.sql': 'select 3;',
    })
    expect(readMigrations(dir)).toEqual([
      { id: 1, name: '00001_a.sql', text: 'select 1;' },
      { id: 2, name: '00002_b.sql', text: 'select 2;' },
    ])
  })

  test('a gap in the numbering is an error naming the file', () => {
    const dir = folder({ '00001_a.sql': 'select 1;', '00003_c.sql': 'select 3;' })
    expect(() => readMigrations(dir)).toThrow('00003_c.sql')
  })

  test('the shipped files start at 00001 and have no gap', () => {
    const files = readMigrations()
    expect(files.map(file => file.id)).toEqual(files.map((_, index) => index + 1))
  })
})
