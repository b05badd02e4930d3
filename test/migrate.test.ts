import { afterAll, afterEach, describe, expect, setSystemTime, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createSql, type Sql } from '../src/db.ts'
import { migrate, MigrationError, readMigrations } from '../src/migrate.ts'
import { until } from './helpers/until.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { startPostgresServer } from './helpers/postgres-server.ts'

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

  test('a run waiting for the lock says every 10 s which session holds it, and goes on once it is let go', async () => {
    const database = await emptyDatabase()
    const stray = connect(database)
    // A session left holding the lock (a stuck deploy, a stray psql).
    const held = await stray.reserve()
    const [row] = await held<{ pid: number }[]>`select pg_backend_pid() as pid, pg_advisory_lock(1634560359)`
    const pid = row!.pid
    const said: { pid: number | null; application: string | null; waitedMs: number }[] = []
    const run = migrate(connect(database), undefined, undefined, { waiting: holder => said.push(holder) })
    // The wall clock stepped back meanwhile (NTP correcting the host): the 10 s are the monotonic clock's.
    setSystemTime(new Date(Date.now() - 3_600_000))
    try {
      await until(async () => said.length > 0, 15_000)
    } finally {
      setSystemTime()
    }
    expect(said[0]).toMatchObject({ pid, application: 'agent-marketplace' })
    expect(said[0]!.waitedMs).toBeGreaterThanOrEqual(10_000)
    await held`select pg_advisory_unlock(1634560359)`
    held.release()
    expect((await run).length).toBe(readMigrations().length)
  }, 30_000)

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

  test('a database ahead of the code (the next release migrated it) is used as it is: nothing applied, the newer migrations reported', async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({ '00001_a.sql': 'create table a (id integer);', '00002_b.sql': 'create table b (id integer);' })
    await migrate(sql, readMigrations(dir))
    const ahead: string[][] = []
    expect(await migrate(sql, readMigrations(dir).slice(0, 1), undefined, { ahead: names => ahead.push(names) })).toEqual([])
    expect(ahead).toEqual([['00002_b.sql']])
    expect(await tableExists(sql, 'b')).toBe(true)
    // Up to date, it reports nothing.
    expect(await migrate(sql, readMigrations(dir), undefined, { ahead: names => ahead.push(names) })).toEqual([])
    expect(ahead).toHaveLength(1)
  })

  test('refuses a database that other code migrated (a migration of the same number, another name), naming both; nothing applied', async () => {
    const sql = connect(await emptyDatabase())
    const ours = { '00001_a.sql': 'create table a (id integer);', '00002_b.sql': 'create table b (id integer);' }
    await migrate(sql, readMigrations(folder({ ...ours, '00003_theirs.sql': 'create table theirs (id integer);' })))
    const mine = readMigrations(
      folder({ ...ours, '00003_mine.sql': 'create table mine (id integer);', '00004_d.sql': 'create table d (id integer);' }),
    )
    const failure = await migrate(sql, mine).catch(error => error)
    expect(failure).toBeInstanceOf(MigrationError)
    expect(failure.message).toContain("the database's migration 3 is 00003_theirs.sql, where this code has 00003_mine.sql")
    expect(await tableExists(sql, 'mine')).toBe(false)
    expect(await tableExists(sql, 'd')).toBe(false)
    // Code behind it by one, where what it has matches, runs on it.
    expect(await migrate(sql, readMigrations(folder(ours)))).toEqual([])
  })

  test('refuses a database whose migrations table lacks one before its last (a row deleted), behind the code or ahead of it', async () => {
    const sql = connect(await emptyDatabase())
    const files = { '00001_a.sql': 'create table a (id integer);', '00002_b.sql': 'create table b (id integer);', '00003_c.sql': 'select 1;' }
    await migrate(sql, readMigrations(folder(files)))
    await sql`delete from migrations where id = 2`
    for (const code of [readMigrations(folder(files)), readMigrations(folder(files)).slice(0, 1)]) {
      const failure = await migrate(sql, code).catch(error => error)
      expect(failure).toBeInstanceOf(MigrationError)
      expect(failure.message).toContain("the database's migrations table has no migration 2, though it has 00003_c.sql")
    }
  })
})

/** Waits until a session of the database waits for a lock (pg_stat_activity), and returns its query. */
async function lockWaiter(observer: Sql, database: TestDatabase): Promise<string> {
  let query = ''
  await until(async () => {
    const [row] = await observer<{ query: string }[]>`
      select query from pg_stat_activity where datname = ${database.name} and wait_event_type = 'Lock'`
    query = row?.query ?? ''
    return row !== undefined
  }, 10_000)
  return query
}

describe('migrate: locks and timeouts', () => {
  test('a migration that cannot get its locks fails within lock_timeout, naming itself, and changes nothing', async () => {
    const database = await emptyDatabase()
    const [sql, holder] = [connect(database), connect(database)]
    const dir = folder({
      '00001_t.sql': 'create table t (id integer primary key);',
      '00002_u.sql': 'create table u (id integer primary key);',
      '00003_alter_t.sql': 'alter table t add column note text;',
    })
    await migrate(sql, readMigrations(dir).slice(0, 1))
    // A reader's open transaction holds a lock that ALTER TABLE's conflicts with.
    await holder`begin`
    await holder`select * from t`
    try {
      const started = Date.now()
      const failure = await migrate(sql, readMigrations(dir), { lockTimeoutMs: 200, statementTimeoutMs: 0 }).catch(error => error)
      expect(failure).toBeInstanceOf(MigrationError)
      expect(failure.migration).toBe('00003_alter_t.sql')
      expect(failure.message).toContain('migration 00003_alter_t.sql could not get its locks within lock_timeout (200 ms)')
      expect(Date.now() - started).toBeLessThan(5000)
    } finally {
      await holder`rollback`
    }
    // Its transaction (with 00002) rolled back; with the lock free, the same run goes through.
    expect(await tableExists(sql, 'u')).toBe(false)
    const [row] = await sql<{ count: number }[]>`select count(*)::int as count from migrations`
    expect(row!.count).toBe(1)
    expect(await migrate(sql, readMigrations(dir), { lockTimeoutMs: 200, statementTimeoutMs: 0 })).toEqual(['00002_u.sql', '00003_alter_t.sql'])
  })

  test('a statement past statement_timeout fails the migration, naming it', async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({ '00001_slow.sql': 'select pg_sleep(2);' })
    const failure = await migrate(sql, readMigrations(dir), { lockTimeoutMs: 0, statementTimeoutMs: 100 }).catch(error => error)
    expect(failure).toBeInstanceOf(MigrationError)
    expect(failure.message).toContain('migration 00001_slow.sql ran past statement_timeout (100 ms)')
  })

  test('a statement past statement_timeout is named so in any language of the server’s messages; a cancel is not', async () => {
    // German messages without a German locale: gettext reads LANGUAGE unless lc_messages is C.
    const server = await startPostgresServer({ settings: { lc_messages: 'C.UTF-8' }, env: { LANGUAGE: 'de' } })
    const sql = createSql(server.url(), { max: 1 })
    const watcher = createSql(server.url(), { max: 1 })
    try {
      const dir = folder({ '00001_slow.sql': 'select pg_sleep(2);' })
      const timedOut = await migrate(sql, readMigrations(dir), { lockTimeoutMs: 0, statementTimeoutMs: 100 }).catch(error => error)
      expect(timedOut.cause.message).toContain('Zeitüberschreitung')
      expect(timedOut.message).toContain('migration 00001_slow.sql ran past statement_timeout (100 ms)')

      const cancelling = migrate(sql, readMigrations(dir), { lockTimeoutMs: 0, statementTimeoutMs: 60_000 }).catch(error => error)
      await until(
        async () =>
          (await watcher`select pg_cancel_backend(pid) as c from pg_stat_activity where query like '%pg_sleep(2)%' and pid <> pg_backend_pid()`)
            .length > 0,
      )
      const cancelled = await cancelling
      expect(cancelled.message).toStartWith('migration 00001_slow.sql failed: ')
    } finally {
      await sql.end()
      await watcher.end()
      await server.stop()
    }
  }, 20_000)

  test("a file's first line sets its own timeouts", async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({ '00001_slow.sql': '-- migrate: statement-timeout=0\nselect pg_sleep(0.3);' })
    expect(await migrate(sql, readMigrations(dir), { lockTimeoutMs: 0, statementTimeoutMs: 100 })).toEqual(['00001_slow.sql'])
  })

  test('a no-transaction migration builds an index concurrently: writers go on, a second migrator waits for the first', async () => {
    const database = await emptyDatabase()
    const [sql, other, writer, observer] = [connect(database), connect(database), connect(database), connect(database)]
    const dir = folder({
      '00001_t.sql': 'create table t (id integer primary key, x integer);\ninsert into t select n, n % 97 from generate_series(1, 20000) n;',
      '00002_t_x.sql': [
        '-- migrate: no-transaction lock-timeout=30000',
        '-- An index left invalid by a failed build is dropped first, so that a second run builds it anew.',
        'drop index concurrently if exists t_x;',
        'create index concurrently t_x on t (x);',
      ].join('\n'),
    })
    await migrate(sql, readMigrations(dir).slice(0, 1))
    // An open writer: the build waits for it to finish, as `create index concurrently` does.
    await writer`begin`
    await writer`insert into t values (0, 0)`
    const first = migrate(sql, readMigrations(dir))
    expect(await lockWaiter(observer, database)).toContain('create index concurrently')
    const second = migrate(other, readMigrations(dir))
    try {
      // A plain `create index` would hold a share lock (queued behind the writer) and block this insert.
      await observer`set statement_timeout = 5000`
      await observer`insert into t values (-1, 1)`
      await observer`reset statement_timeout`
    } finally {
      await writer`commit`
    }
    const results = await Promise.all([first, second])
    expect(results).toEqual([['00002_t_x.sql'], []])
    const [index] = await sql<{ valid: boolean }[]>`
      select indisvalid as valid from pg_index where indexrelid = 't_x'::regclass`
    expect(index!.valid).toBe(true)
    const rows = await sql<{ id: number }[]>`select id from migrations order by id`
    expect(rows.map(row => row.id)).toEqual([1, 2])
  })

  test("a no-transaction migration's failure names it; what it did before stays, and it is not recorded", async () => {
    const sql = connect(await emptyDatabase())
    const dir = folder({
      '00001_t.sql': 'create table t (id integer primary key);',
      '00002_two.sql': '-- migrate: no-transaction\ncreate index concurrently t_id on t (id);\ncreate index concurrently broken on nowhere (id);',
    })
    const failure = await migrate(sql, readMigrations(dir)).catch(error => error)
    expect(failure).toBeInstanceOf(MigrationError)
    expect(failure.message).toContain('migration 00002_two.sql failed: relation "nowhere" does not exist')
    expect(await tableExists(sql, 't_id')).toBe(true)
    const rows = await sql<{ id: number }[]>`select id from migrations order by id`
    expect(rows.map(row => row.id)).toEqual([1])
  })
})

describe('readMigrations', () => {
  test('an unknown option on the first line is an error naming the file', () => {
    const dir = folder({ '00001_a.sql': '-- migrate: no-transactoin\nselect 1;' })
    expect(() => readMigrations(dir)).toThrow('00001_a.sql: unknown option "no-transactoin"')
  })

  test('a no-transaction file with a dollar-quoted body is refused', () => {
    const dir = folder({ '00001_a.sql': '-- migrate: no-transaction\ndo $$ begin perform 1; end $$;' })
    expect(() => readMigrations(dir)).toThrow('00001_a.sql: a no-transaction migration cannot hold dollar-quoted bodies')
  })

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

/**
 * The statements of a migration that take away what the previous release may still read or write
 * without (sql/README.md, "Two releases on one schema"), unless the file says on a line of its own
 * `-- contracts: <why no running release needs it>`: a table, column or function dropped or renamed,
 * a column made `not null`, given another type, or added `not null` without a default, a constraint added.
 */
function unmarkedContractions(migration: { text: string }): string[] {
  if (/^-- contracts: \S/m.test(migration.text)) return []
  const body = migration.text.replace(/--.*$/gm, '')
  const contracting =
    /\b(drop\s+(table|column|function)\b|rename\s+(to|column)\b|alter\s+column\s+\S+\s+(set\s+not\s+null|(set\s+data\s+)?type)\b|add\s+constraint\b|add\s+column\s+(if\s+not\s+exists\s+)?\S+\s+(?![^,;]*\bdefault\b)[^,;]*\bnot\s+null\b)/gi
  return [...body.matchAll(contracting)].map(match => match[0].replace(/\s+/g, ' ').toLowerCase())
}

/** The last file shipped before the rule: the service had never been deployed, so no release ran on an older schema. */
const lastBeforeTheRule = 21

describe('migrations keep the previous release working', () => {
  test('each file after the rule adds only, or says what it contracts and why no running release needs it', () => {
    const files = readMigrations().filter(migration => migration.id > lastBeforeTheRule)
    const unmarked = files.map(file => ({ file: file.name, found: unmarkedContractions(file) })).filter(({ found }) => found.length > 0)
    expect(unmarked).toEqual([])
  })

  test('the check finds what a rollback would trip on, and takes a file that says why', () => {
    const found = (text: string) => unmarkedContractions({ text })
    expect(found('alter table users add column nickname text;')).toEqual([])
    expect(found("alter table users add column tier text not null default 'free';")).toEqual([])
    expect(found('create table notes (id uuid primary key, body text not null);')).toEqual([])
    expect(found('create index concurrently notes_by_time on notes (created_at);')).toEqual([])
    expect(found('alter table users drop column nickname;')).toEqual(['drop column'])
    expect(found('ALTER TABLE users RENAME COLUMN email TO mail;')).toEqual(['rename column'])
    expect(found('alter table users rename to people;')).toEqual(['rename to'])
    expect(found('drop table notes;\ndrop function uuid_v7();')).toEqual(['drop table', 'drop function'])
    expect(found('alter table users alter column email set not null;')).toEqual(['alter column email set not null'])
    expect(found('alter table users alter column email type citext;')).toEqual(['alter column email type'])
    expect(found('alter table users add column tier text not null;')).toEqual(['add column tier text not null'])
    expect(found('alter table users add constraint email_lower check (email = lower(email));')).toEqual(['add constraint'])
    // Said in a comment, it is not a statement.
    expect(found('-- before: alter table users drop column nickname;\nselect 1;')).toEqual([])
    expect(
      found('-- contracts: 00022 stopped reading nickname, and 00022 is the oldest release running\nalter table users drop column nickname;'),
    ).toEqual([])
  })
})
