/** PostgreSQL connections: one postgres.js pool per process, bigint parsed as number (all amounts fit). */
import postgres from 'postgres'
import { errorFields, type Log } from './log.ts'

export type Sql = postgres.Sql<{ bigint: number }>
export type TxSql = postgres.TransactionSql<{ bigint: number }>
/** What store functions take: the pool or a transaction, so transactions compose. */
export type Db = postgres.ISql<{ bigint: number }>

export interface SqlOptions {
  max?: number
  applicationName?: string
  /** Planner settings of these connections (e.g. `enable_seqscan`). */
  settings?: Record<string, string>
  /**
   * How long one statement may run, lock waits included, before Postgres cancels it (0 or unset: the
   * role's setting). Set, it bounds the wait on a server gone silent too (`silenceGraceMs` past it).
   */
  statementTimeoutMs?: number
  /**
   * How long one statement may wait for a lock (a row another transaction holds, a table an operator's
   * `alter table` or `lock table` holds) before Postgres gives it up with 55P03, a transient failure
   * (0 or unset: the role's setting).
   */
  lockTimeoutMs?: number
}

/**
 * How long past its statement timeout a connection that owes an answer may hear nothing from the
 * server before it is destroyed (CONNECTION_SILENT, the patched driver's: patches/README.md): a
 * half-open socket, through a host or a middlebox gone silent, would otherwise hold its queries for ever.
 */
export const silenceGraceMs = 5000

/**
 * What the service's SQL and the driver assume of a session, whatever the role's or the database's
 * defaults (an operator's, a managed service's): UTC, so month arithmetic in SQL (billing periods)
 * matches the application's; times in the form the driver parses (under `DateStyle = 'SQL, DMY'` it
 * reads them wrong); and read committed, which the statements' races are written for (under
 * serializable or repeatable read, racing writes fail as 503 rather than wait: 50 concurrent
 * subscriptions were 49 503s instead of 409s). Sent at startup, they outrank those settings; a pooler
 * may drop one, which reachDatabase refuses (reach-database.ts).
 */
export const sessionDefaults = {
  // The driver's own (it reads and writes UTF-8 only), stated so that another is refused: one in
  // DATABASE_URL (`?client_encoding=LATIN1`) outranks it, and text was stored garbled without an error.
  client_encoding: 'UTF8',
  TimeZone: 'UTC',
  DateStyle: 'ISO, MDY',
  default_transaction_isolation: 'read committed',
} as const

export function createSql(url: string, options: SqlOptions = {}): Sql {
  return postgres(url, {
    max: options.max ?? 10,
    idle_timeout: 30,
    connect_timeout: 5,
    // Seconds; a timer takes at most 2^31 - 1 ms, and one given more fires at once.
    silence_timeout: options.statementTimeoutMs ? Math.min(options.statementTimeoutMs + silenceGraceMs, 2 ** 31 - 1) / 1000 : null,
    // Reconnect at most 500 ms apart: postgres.js's default grows to 20 s with the pool's failed
    // connects, which kept a restarted server out of use for seconds after it accepted again.
    backoff: attempts => Math.min(0.05 * 2 ** attempts, 0.5),
    onnotice: () => {},
    connection: {
      application_name: options.applicationName ?? 'agent-marketplace',
      ...sessionDefaults,
      ...(options.statementTimeoutMs ? { statement_timeout: options.statementTimeoutMs } : {}),
      ...(options.lockTimeoutMs ? { lock_timeout: options.lockTimeoutMs } : {}),
      ...options.settings,
    },
    types: {
      bigint: {
        to: 20,
        from: [20],
        serialize: (value: number) => String(value),
        parse: (value: string) => Number(value),
      },
      bytea: {
        to: 17,
        from: [17],
        serialize: (value: Uint8Array) => '\\x' + Buffer.from(value).toString('hex'),
        parse: parseBytea,
      },
    },
  })
}

/**
 * A bytea as the server writes it: hex (`\x...`, the default `bytea_output`) or escape (a role's or
 * server's `bytea_output = escape`: printable bytes as themselves, `\\`, and `\ooo` in octal). The
 * driver reads only hex, and escape made key hashes, sealed credentials and stored idempotent answers
 * garbage. Read either rather than send `bytea_output` at startup: PgBouncer refuses it there.
 */
function parseBytea(text: string): Buffer {
  if (text.startsWith('\\x')) return Buffer.from(text.slice(2), 'hex')
  const bytes = Buffer.allocUnsafe(text.length)
  let n = 0
  for (let i = 0; i < text.length;) {
    if (text[i] !== '\\') {
      bytes[n++] = text.charCodeAt(i)
      i += 1
    } else if (text[i + 1] === '\\') {
      bytes[n++] = 0x5c
      i += 2
    } else {
      bytes[n++] = parseInt(text.slice(i + 1, i + 4), 8)
      i += 4
    }
  }
  return bytes.subarray(0, n)
}

/**
 * Which PostgreSQL the pools reach, for what others derived from its data (Redis's inboxes, the
 * caches of keys and users): the cluster (`system_identifier`), its timeline as WAL is written now (a
 * promoted replica or a point-in-time recovery starts a new one at once; `pg_control_checkpoint()`
 * names it only after the next checkpoint, seconds or minutes later), the database and its
 * `conversations` table (a dump restored makes them anew, under the same names or others). A backup
 * restored, or a replica promoted that lagged, holds an older copy of the data than what was derived
 * from it, and has another identity. Null where the server does not say: a standby in recovery
 * writes no WAL of its own; a managed server may refuse `pg_control_system()`.
 */
export async function readDatabaseIdentity(sql: Sql): Promise<string | null> {
  const [row] = await sql<{ identity: string | null }[]>`
    select case when not pg_is_in_recovery() then concat_ws(':',
      (select system_identifier from pg_control_system()),
      left(pg_walfile_name(pg_current_wal_lsn()), 8),
      (select oid from pg_database where datname = current_database()),
      'conversations'::regclass::oid
    ) end as identity
  `
  return row!.identity
}

/** The identity of the database a pool reaches (readDatabaseIdentity), read again every `everyMs`. */
export interface DatabaseIdentity {
  /** The last identity read (null until one was: the server does not say). */
  current(): string | null
  /** Reads it now; a change is told to the listeners before this resolves. */
  check(): Promise<string | null>
  /** Called with the new identity and the one before, each time a read finds another than before. */
  onChange(listener: (identity: string, previous: string) => void): void
  close(): void
}

/**
 * Reads the identity at once and then every `everyMs`, so that a process whose pools were led to
 * another server (a failover's DNS name or proxy, no restart) stops serving what it derived from the
 * one before within that time. A read that fails (the server away, the table gone mid-restore) or
 * says nothing keeps the last.
 * A server that refuses the read (a role not allowed `pg_control_system()`) is logged once: nothing
 * going back in time is noticed on it.
 */
export async function watchDatabaseIdentity(sql: Sql, log: Log, everyMs = 1000): Promise<DatabaseIdentity> {
  let known: string | null = null
  let refusalLogged = false
  const refused = (error: unknown) => {
    if (isDatabaseUnavailable(error)) throw error
    // No `conversations` table (undefined_table): the database is being made again under the pools
    // (`pg_restore --clean` drops the tables before it creates them), not refusing; a read once the
    // restore has made the table tells its new identity. Logged as a refusal, it said going back in
    // time "will not be noticed" the moment before it was, and hid a real refusal later on.
    if ((error as { code?: unknown } | null)?.code === '42P01') return null
    if (!refusalLogged) {
      refusalLogged = true
      log.warn('postgres refuses to tell its identity: a backup restored or a lagging replica promoted will not be noticed', errorFields(error))
    }
    return null
  }
  // Reads overlap (the timer's, a caller's): one that began before the last one applied is stale.
  let begun = 0
  let applied = 0
  const listeners: ((identity: string, previous: string) => void)[] = []
  const check = async () => {
    const n = ++begun
    const read = await readDatabaseIdentity(sql).catch(refused)
    if (read === null || read === known || n < applied) return known
    applied = n
    const previous = known
    known = read
    if (previous !== null) for (const listener of listeners) listener(read, previous)
    return known
  }
  await check().catch(() => null)
  const timer = setInterval(() => void check().catch(() => null), everyMs)
  timer.unref()
  return {
    current: () => known,
    check,
    onChange: listener => void listeners.push(listener),
    close: () => clearInterval(timer),
  }
}

/**
 * Deletes the rows of `table` whose `column` is before `olderThan`, 5,000 a statement (through its
 * index on that column), so that no one statement holds many row locks or writes much WAL at once,
 * however large the backlog; how many it deleted.
 */
export async function deleteOlderThan(sql: Sql, table: string, column: string, olderThan: Date): Promise<number> {
  let total = 0
  for (;;) {
    const [row] = await sql<{ n: number }[]>`
      with gone as (
        delete from ${sql(table)}
        where ctid in (select ctid from ${sql(table)} where ${sql(column)} < ${olderThan} limit 5000)
        returning 1
      )
      select count(*)::int as n from gone
    `
    total += row!.n
    if (row!.n < 5000) return total
  }
}

// Errno codes of a socket that could not be opened or was lost. Bun reports an unreachable host or
// network as ECONNREFUSED, Node as EHOSTUNREACH or ENETUNREACH; a name that does not resolve (a
// failover's DNS change, a resolver away) is ENOTFOUND or EAI_AGAIN.
const socketCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'ECONNABORTED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EHOSTDOWN',
  'ENETDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
])

// postgres.js's own: a connect timed out, a connection closed, ended or destroyed under its queries,
// or silent past its statement timeout (CONNECTION_SILENT, the patched driver's: patches/README.md).
const driverCodes = new Set(['CONNECT_TIMEOUT', 'CONNECTION_CLOSED', 'CONNECTION_ENDED', 'CONNECTION_DESTROYED', 'CONNECTION_SILENT'])

/**
 * True when the connection to the database could not be made or was lost, or the server ended the
 * session (as opposed to a statement refused on a live one): a statement sent on it may have committed.
 */
export function isConnectionError(error: unknown): boolean {
  const e = error as { code?: unknown; syscall?: unknown; severity?: unknown } | null
  const code = e?.code
  if (typeof code !== 'string') return false
  return (
    socketCodes.has(code) ||
    driverCodes.has(code) ||
    // Any failure to open the socket (a firewall's EACCES too) or to resolve the host's name.
    e?.syscall === 'connect' ||
    e?.syscall === 'getaddrinfo' ||
    // The server ended the session, or would not start one: a statement's own errors are ERROR. At
    // run time (the boot reports them in one line: reachDatabase) these are the role's password
    // changed (28P01) or its login revoked (28000), the database renamed or dropped (3D000), closed
    // to connections (55000) or its CONNECT taken away (42501), an idle timeout (25P03, 57P05).
    e?.severity === 'FATAL' ||
    e?.severity === 'PANIC' ||
    // Connection exceptions (08P01: a protocol violation at startup, a pooler refusing a startup
    // parameter, say), and the server going away: shut down (57P01), crashed (57P02), starting or
    // recovering (57P03), the database dropped (57P04). 57014 (canceled) is a statement's.
    code.startsWith('08') ||
    code.startsWith('57P') ||
    code === '53300' ||
    // read-only: a hot standby or a fenced old primary that a failover's DNS or proxy led a connection to
    code === '25006'
  )
}

/**
 * True when the database cannot serve now, whatever the statement: its connection failed
 * (isConnectionError), or the server refused the statement for want of resources (class 53: disk
 * full, out of memory, too many connections, a configured limit such as temp_file_limit) or for a
 * fault of its own (class 58: an I/O error). Nothing of the request's doing: 503, and an actor's
 * command waits rather than counting as failing. Unlike a connection error, a refused statement
 * changed nothing.
 */
export function isDatabaseUnavailable(error: unknown): boolean {
  if (isConnectionError(error)) return true
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'string' && /^5[38]/.test(code)
}

// serialization failure, deadlock, lock not available, canceled (a statement timeout, or an operator's
// cancel), and a COMMIT answered as ROLLBACK (the patched driver's code: patches/README.md)
const transientStates = new Set(['40001', '40P01', '55P03', '57014', 'COMMIT_ROLLED_BACK'])

/** True when Postgres gave up a statement for want of time or a lock, having changed nothing: the same request may succeed again. */
export function isTransientFailure(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'string' && transientStates.has(code)
}

/** The Postgres error code for a unique violation, with the constraint that fired. */
export function uniqueViolation(error: unknown): string | undefined {
  const e = error as { code?: string; constraint_name?: string } | null
  return e?.code === '23505' ? (e.constraint_name ?? '') : undefined
}

// invalid byte sequence or untranslatable character, string too long, numeric out of range, bad text
// form, datetime out of range or badly formed
const badInputStates = new Set(['22021', '22P05', '22001', '22003', '22P02', '22008', '22007'])

/** True when Postgres refused a value the client sent (not a fault of ours or of the database). */
export function isBadInput(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'string' && badInputStates.has(code)
}
