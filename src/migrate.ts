/**
 * Forward-only migrations: numbered files in sql/ (sql/README.md), applied under a lock between
 * processes, each within a lock_timeout and a statement_timeout.
 */
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

export interface MigrationTimeouts {
  /** How long a migration's statement waits for a lock before the migration fails; 0: for ever. */
  lockTimeoutMs: number
  /** How long one statement of a migration may run; 0: no limit. */
  statementTimeoutMs: number
}

/**
 * Waiting for a lock queues every later query on that table behind the migration, so the wait is
 * short; a statement that runs for minutes at deploy is a surprise worth stopping.
 */
export const defaultTimeouts: MigrationTimeouts = { lockTimeoutMs: 5000, statementTimeoutMs: 600_000 }

/** What a migration's first line (`-- migrate: ...`) asks for. */
export interface MigrationOptions {
  /** False for `no-transaction`: each statement is run and committed on its own. */
  transaction: boolean
  lockTimeoutMs?: number
  statementTimeoutMs?: number
}

/** A migration that did not apply, named in the message. */
export class MigrationError extends Error {
  override name = 'MigrationError'
  constructor(
    readonly migration: string,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options)
  }
}

export function readMigrations(dir = migrationsDir): Migration[] {
  const files = readdirSync(dir)
    .filter(file => /^\d{5}_[a-z0-9_-]+\.sql$/.test(file))
    .sort()
  return files.map((file, index) => {
    const id = Number(file.slice(0, 5))
    if (id !== index + 1) throw new Error(`migration ${file} breaks the sequence: expected number ${index + 1}`)
    const migration = { id, name: file, text: readFileSync(join(dir, file), 'utf8') }
    migrationOptions(migration)
    return migration
  })
}

/** The last migration the database has applied (0: none, or no `migrations` table yet). */
export async function lastApplied(sql: Sql): Promise<number> {
  try {
    const [row] = await sql<{ max: number }[]>`select coalesce(max(id), 0)::int as max from migrations`
    return row!.max
  } catch (error) {
    if ((error as { code?: string }).code === '42P01') return 0
    throw error
  }
}

/** For a tool that needs the service's tables: throws one line saying to migrate when the database lacks some of this code's migrations. */
export async function requireMigrated(sql: Sql, migrations = readMigrations()): Promise<void> {
  const applied = await lastApplied(sql)
  if (applied < migrations.length) {
    throw new Error(`the database at DATABASE_URL has ${applied} of this code's ${migrations.length} migrations: run \`npm run migrate\` first`)
  }
}

/** What the migrations leave in the database, by name: what the service's role must be allowed to use (reachDatabase). */
export interface ServiceObjects {
  /** Its tables, `migrations` among them: it reads and writes every one (their sequences go with them). */
  tables: string[]
  /** Its functions, called by the tables' defaults, checks and triggers. */
  functions: string[]
}

/**
 * Reads the names from the files' `create table` and `create function` statements, less those a
 * later file drops (names unquoted and unqualified, as sql/README.md asks;
 * test/least-privilege.test.ts checks the result against a migrated database).
 */
export function serviceObjects(migrations = readMigrations()): ServiceObjects {
  const named = (text: string, statement: string) =>
    [...text.matchAll(new RegExp(String.raw`\b${statement}\s+([a-z_][a-z0-9_]*)`, 'gi'))].map(match => match[1]!.toLowerCase())
  const tables = new Set(['migrations'])
  const functions = new Set<string>()
  for (const migration of migrations) {
    const text = migration.text.replace(/--.*$/gm, '')
    for (const name of named(text, String.raw`create\s+table(?:\s+if\s+not\s+exists)?`)) tables.add(name)
    for (const name of named(text, String.raw`drop\s+table(?:\s+if\s+exists)?`)) tables.delete(name)
    for (const name of named(text, String.raw`create(?:\s+or\s+replace)?\s+function`)) functions.add(name)
    for (const name of named(text, String.raw`drop\s+function(?:\s+if\s+exists)?`)) functions.delete(name)
  }
  return { tables: [...tables], functions: [...functions] }
}

/** Reads the first line's options: `-- migrate: no-transaction lock-timeout=0 statement-timeout=0`. */
export function migrationOptions(migration: Migration): MigrationOptions {
  const options: MigrationOptions = { transaction: true }
  const header = /^-- migrate:(.*)$/m.exec(migration.text.split('\n', 1)[0]!)
  if (!header) return options
  for (const word of header[1]!.split(/[\s,]+/).filter(Boolean)) {
    const [key, value] = word.split('=')
    if (key === 'no-transaction' && value === undefined) options.transaction = false
    else if ((key === 'lock-timeout' || key === 'statement-timeout') && /^\d+$/.test(value ?? '')) {
      options[key === 'lock-timeout' ? 'lockTimeoutMs' : 'statementTimeoutMs'] = Number(value)
    } else {
      throw new MigrationError(migration.name, `migration ${migration.name}: unknown option "${word}" on its first line (see sql/README.md)`)
    }
  }
  if (!options.transaction) statementsOf(migration)
  return options
}

/**
 * Applies every pending migration. Consecutive migrations that run in a transaction share one: all
 * of them apply, or none. A `no-transaction` migration commits what came before it and runs alone.
 * Two processes starting together both succeed: the second waits for the lock, then finds nothing
 * left to do. The lock is the session's, so it lasts across the transactions of one run. A database
 * ahead of the code is used as it is (`report.ahead`); one that other code migrated is refused.
 *
 * @example
 * const applied = await migrate(sql)
 */
export async function migrate(
  sql: Sql,
  migrations = readMigrations(),
  timeouts: MigrationTimeouts = defaultTimeouts,
  report: MigrationReport = {},
): Promise<string[]> {
  const session = await sql.reserve()
  try {
    await takeLock(session, report.waiting ?? (() => {}))
    try {
      return await applyPending(session, migrations, timeouts, report.ahead ?? (() => {}))
    } finally {
      await session`select pg_advisory_unlock(${lockId})`.catch(() => {})
    }
  } finally {
    session.release()
  }
}

/** What a run tells as it goes, besides what it applied. */
export interface MigrationReport {
  /** Every 10 s while another session holds the migration lock. */
  waiting?: (holder: LockHolder) => void
  /**
   * The database has migrations after this code's last (newer code applied them: the next release
   * during a rollout, or the release rolled back from): the code runs on that schema as it is.
   */
  ahead?: (names: string[]) => void
}

/**
 * Waits for the migration lock by trying again and again. A session waiting in pg_advisory_lock is a
 * transaction, and `create index concurrently` waits for every transaction older than its build to
 * end: a second process waiting so, while the first builds an index, is a deadlock.
 */
async function takeLock(session: Sql, waiting: (holder: LockHolder) => void) {
  // The monotonic clock: a wall clock stepped back would silence the waiting for as long as the step.
  const began = performance.now()
  let said = began
  for (;;) {
    const [row] = await session<{ locked: boolean }[]>`select pg_try_advisory_lock(${lockId}) as locked`
    if (row!.locked) return
    if (performance.now() - said >= sayWaitingEveryMs) {
      said = performance.now()
      waiting({ ...(await lockHolder(session)), waitedMs: Math.round(said - began) })
    }
    await Bun.sleep(lockRetryMs)
  }
}

const lockRetryMs = 100
const sayWaitingEveryMs = 10_000

/** Who holds the migration lock, for an operator to find it: another run migrating, or a session left holding it. */
export interface LockHolder {
  pid: number | null
  application: string | null
  state: string | null
  since: Date | null
  waitedMs: number
}

async function lockHolder(session: Sql): Promise<Omit<LockHolder, 'waitedMs'>> {
  const [holder] = await session<Omit<LockHolder, 'waitedMs'>[]>`
    select a.pid, a.application_name as application, a.state, a.backend_start as since
    from pg_locks l join pg_stat_activity a on a.pid = l.pid
    where l.locktype = 'advisory' and l.granted and l.classid = 0 and l.objid = ${lockId}::bigint::oid and l.objsubid = 1
      and l.database = (select oid from pg_database where datname = current_database())
  `
  return holder ?? { pid: null, application: null, state: null, since: null }
}

async function applyPending(session: Sql, migrations: Migration[], timeouts: MigrationTimeouts, ahead: (names: string[]) => void): Promise<string[]> {
  await session`begin`
  let inTransaction = true
  try {
    const state = await readState(session)
    const newer = newerThan(migrations, state.applied)
    const pending = migrations.slice(state.current)
    if (pending.length === 0) {
      await session`commit`
      if (newer.length > 0) ahead(newer)
      return []
    }
    // Only with something to apply: `create ... if not exists` needs the schema's CREATE even when
    // the table exists, which a role that may only read and write the tables (docs/operations.md,
    // the service's grants) lacks, and a boot with nothing pending stopped on it.
    await session`
      create table if not exists migrations (
        id integer primary key,
        name text not null,
        applied_at timestamptz not null default now()
      )
    `.catch(error => {
      throw explained(pending[0]!, error, timeouts, 0, state)
    })
    for (const migration of pending) {
      const options = migrationOptions(migration)
      const limits = { ...timeouts, ...definedOnly(options) }
      if (options.transaction && !inTransaction) {
        await session`begin`
        inTransaction = true
      } else if (!options.transaction && inTransaction) {
        await session`commit`
        inTransaction = false
      }
      await apply(session, migration, options.transaction, limits, state)
    }
    if (inTransaction) await session`commit`
    return pending.map(migration => migration.name)
  } catch (error) {
    if (inTransaction) await session`rollback`.catch(() => {})
    throw error
  }
}

/** Where a run starts, read without creating anything; names quoted as identifiers, for the statements an error suggests. */
interface State {
  /** The last migration applied (0: none, or no `migrations` table). */
  current: number
  /** What the `migrations` table records, in order. */
  applied: Pick<Migration, 'id' | 'name'>[]
  role: string
  schema: string | null
}

async function readState(session: Sql): Promise<State> {
  const [row] = await session<(Omit<State, 'current' | 'applied'> & { exists: boolean })[]>`
    select quote_ident(current_user) as role, quote_ident(current_schema()) as schema, to_regclass('migrations') is not null as exists
  `
  const { exists, ...who } = row!
  if (!exists) return { current: 0, applied: [], ...who }
  const applied = await session<Pick<Migration, 'id' | 'name'>[]>`select id, name from migrations order by id`
  return { current: applied.at(-1)?.id ?? 0, applied, ...who }
}

/**
 * The names of the applied migrations past this code's last. One this code also numbers must be
 * its file: another name means other code (another branch) migrated the database, and nothing runs.
 * Nor does it on a gap (a row deleted by hand): the run starts after the last row, so a missing one
 * would never apply, and code behind the database would take it for the schema it expects.
 */
function newerThan(migrations: Migration[], applied: State['applied']): string[] {
  for (const [index, { id, name }] of applied.entries()) {
    if (id !== index + 1) {
      throw new MigrationError(
        name,
        `the database's migrations table has no migration ${index + 1}, though it has ${name}: apply that migration ` +
          'by hand and record it, or restore the database',
      )
    }
    const file = migrations[id - 1]
    if (file && file.name !== name) {
      throw new MigrationError(
        file.name,
        `the database's migration ${id} is ${name}, where this code has ${file.name}: other code migrated it; ` +
          'deploy the code that did, or restore the database from before it',
      )
    }
  }
  return applied.filter(({ id }) => id > migrations.length).map(({ name }) => name)
}

/** Runs one migration and records it: in the open transaction, or statement by statement. */
async function apply(session: Sql, migration: Migration, transaction: boolean, limits: MigrationTimeouts, state: State) {
  // Set for the transaction (local), or for the session until reset below.
  await session`
    select set_config('lock_timeout', ${String(limits.lockTimeoutMs)}, ${transaction}),
           set_config('statement_timeout', ${String(limits.statementTimeoutMs)}, ${transaction})
  `
  const began = performance.now()
  try {
    if (transaction) await session.unsafe(migration.text)
    else for (const statement of statementsOf(migration)) await session.unsafe(statement)
  } catch (error) {
    throw explained(migration, error, limits, performance.now() - began, state)
  } finally {
    if (!transaction) await session`reset lock_timeout`.then(() => session`reset statement_timeout`).catch(() => {})
  }
  await session`insert into migrations (id, name) values (${migration.id}, ${migration.name})`
}

/**
 * A `no-transaction` migration's statements, each ending with a semicolon at the end of a line.
 * Postgres runs several statements sent at once in one transaction, which `create index
 * concurrently` refuses, so they go one by one; dollar-quoted bodies (which may hold such lines)
 * are refused rather than split wrongly.
 */
function statementsOf(migration: Migration): string[] {
  const body = migration.text
    .split('\n')
    .filter(line => !/^\s*--/.test(line))
    .join('\n')
  if (/\$[A-Za-z_0-9]*\$/.test(body)) {
    throw new MigrationError(migration.name, `migration ${migration.name}: a no-transaction migration cannot hold dollar-quoted bodies`)
  }
  return body
    .split(/;[ \t]*$/m)
    .map(statement => statement.trim())
    .filter(Boolean)
}

/** `ranMs`: how long the migration ran before it failed; `state`: where the run started, as whom. */
function explained(migration: Migration, error: unknown, limits: MigrationTimeouts, ranMs: number, state: State): MigrationError {
  const e = error as { code?: string; message?: string }
  const message = e?.message ?? String(error)
  // insufficient_privilege: the service's own role, allowed only to read and write the tables, at a
  // boot with migrations pending (a fresh database, or an upgrade whose migrations no one applied).
  if (e?.code === '42501') {
    const what =
      state.current === 0
        ? `may not create the service's tables in schema ${state.schema} (from PostgreSQL 15 on, only the database's ` +
          `owner may by default): grant create on schema ${state.schema} to ${state.role}, or run npm run migrate with a DATABASE_URL whose role may`
        : `may not change the service's tables: run npm run migrate with a DATABASE_URL whose role owns them, then start the service`
    return new MigrationError(migration.name, `migration ${migration.name} failed: ${message}: role ${state.role} ${what}`, { cause: error })
  }
  if (e?.code === '55P03') {
    return new MigrationError(
      migration.name,
      `migration ${migration.name} could not get its locks within lock_timeout (${limits.lockTimeoutMs} ms): another session holds ` +
        'a conflicting lock (see pg_locks and pg_stat_activity). Migrate again when it is done, or raise MIGRATION_LOCK_TIMEOUT_MS',
      { cause: error },
    )
  }
  // 57014 is also an operator's cancel. The message tells them apart only in English (lc_messages
  // translates it), so the time does: a cancel before the limit was up is no timeout.
  if (e?.code === '57014' && limits.statementTimeoutMs > 0 && ranMs >= limits.statementTimeoutMs) {
    return new MigrationError(
      migration.name,
      `migration ${migration.name} ran past statement_timeout (${limits.statementTimeoutMs} ms) and was stopped; raise ` +
        'MIGRATION_STATEMENT_TIMEOUT_MS, or give the file its own statement-timeout (sql/README.md)',
      { cause: error },
    )
  }
  return new MigrationError(migration.name, `migration ${migration.name} failed: ${message}`, { cause: error })
}

function definedOnly(options: MigrationOptions): Partial<MigrationTimeouts> {
  const limits: Partial<MigrationTimeouts> = {}
  if (options.lockTimeoutMs !== undefined) limits.lockTimeoutMs = options.lockTimeoutMs
  if (options.statementTimeoutMs !== undefined) limits.statementTimeoutMs = options.statementTimeoutMs
  return limits
}
