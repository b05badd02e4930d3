/** The boot's first step: whether DATABASE_URL leads to a session the service can run in, or one line saying why not. */
import { createSql, sessionDefaults, type Sql, type SqlOptions } from './db.ts'
import { serviceObjects } from './migrate.ts'
import { firstLine, redactUrl } from './text.ts'

/**
 * Reads, on a connection of its own opened with `options`' startup parameters (those the service's
 * pools send), what a session of the pools is given (readSession), or throws one line naming
 * DATABASE_URL and why (a boot's or a tool's first step: the driver's own errors name only a host, or
 * nothing). A session the service cannot run right in is refused in one line too (sessionRefusal):
 * settings it cannot run under, a server that takes no writes, and a role that may not use all of
 * the service's tables, which the boot passed before and the requests met as 500s.
 */
export async function reachDatabase(url: string, options: Pick<SqlOptions, 'statementTimeoutMs' | 'lockTimeoutMs' | 'settings'> = {}): Promise<void> {
  let sql: Sql | undefined
  let refusal: string | null
  let session: Session | undefined
  try {
    sql = createSql(url, { max: 1, ...options })
    // First, alone: an older server may not know what readSession asks.
    const [server] = await sql<{ version: string; number: number }[]>`
      select current_setting('server_version') as version, current_setting('server_version_num')::int as number`
    refusal = versionRefusal(server!.number, server!.version)
    if (!refusal) session = await readSession(sql)
  } catch (error) {
    throw new Error(`PostgreSQL is not reachable at DATABASE_URL=${redactUrl(url)}: ${firstLine(error)}${unreachableHint(firstLine(error))}`)
  } finally {
    await sql?.end({ timeout: 1 }).catch(() => {})
  }
  refusal ??= sessionRefusal(session!)
  if (refusal) throw new Error(`PostgreSQL at DATABASE_URL=${redactUrl(url)} cannot serve: ${refusal}`)
}

/** What to do about a connection that failed, where the driver's own words do not say it: '' when they do. */
function unreachableHint(message: string): string {
  // PgBouncer refuses startup parameters it was not told to ignore, in any pool mode.
  if (/unsupported startup parameter/.test(message)) return ' (behind PgBouncer: add it to ignore_startup_parameters)'
  // With sslmode=require or verify-*, the driver begins TLS though the server said it has none, and the server closes on it.
  if (/before secure TLS connection was established/.test(message)) {
    return ' (what a server that takes no TLS does: turn ssl on there, or drop sslmode from DATABASE_URL)'
  }
  return ''
}

/** The oldest PostgreSQL the service runs on (`server_version_num`): 13 has gen_random_uuid() built in, which the migrations call. */
export const oldestVersion = 130000

/** A server older than oldestVersion, in one line (`version` as it names itself); null when new enough. */
export function versionRefusal(number: number, version: string): string | null {
  if (number >= oldestVersion) return null
  return (
    `it is PostgreSQL ${version}, and the service needs ${oldestVersion / 10000} or later (its migrations call gen_random_uuid(), built in from 13 on): ` +
    `upgrade the server (pg_upgrade) or point DATABASE_URL to a newer one`
  )
}

interface Setting {
  name: string
  setting: string
  /** Where the value comes from (`pg_settings.source`): `user` for `alter role ... set`, `client` for a startup parameter. */
  source: string
}

interface Session {
  /** sessionDefaults, search_path and default_transaction_read_only, as the session has them. */
  settings: Setting[]
  /** A hot standby (or a server restoring a backup): it takes no writes. */
  inRecovery: boolean
  /** The session's TimeZone keeps UTC's time at every month from 1970 to 2100 (`Etc/UTC`, `GMT`, `Zulu`): as good as UTC. */
  utcZone: boolean
  /** Where the migrations create tables: search_path's first schema that exists (null: none). */
  schema: string | null
  /** The schemas holding the service's tables (`migrations`, with its `applied_at`, and `conversations`) that this role can read. */
  tablesIn: string[]
  /** Those of tablesIn this role lacks USAGE on: search_path passes over them, as if they did not exist. */
  withoutUsage: string[]
  role: string
  database: string
  /** The database's `server_encoding`. */
  encoding: string
  /** The service's tables, their sequences and its functions in `schema` that this role may not use as the service does. */
  refused: Refused[]
}

/** One of the service's objects the role may not use: the privileges it lacks, or row-level security applying to it. */
interface Refused {
  kind: 'table' | 'sequence' | 'function'
  /**
   * Qualified by its schema, as identifiers (the statement that fixes it is run by another role, with
   * another search_path); a function with its argument types.
   */
  name: string
  missing: string[]
  rowSecurity: boolean
}

/** Names come quoted as identifiers, to be compared as such and written into the statement that fixes a setting. */
async function readSession(sql: Sql): Promise<Session> {
  const names = [...Object.keys(sessionDefaults), 'search_path', 'default_transaction_read_only']
  const [settings, [row], refused] = await Promise.all([
    sql<Setting[]>`select name, setting, source from pg_settings where name = any(${names})`,
    sql<Omit<Session, 'settings' | 'refused'>[]>`
      with service as (
        select n.oid, quote_ident(n.nspname) as name from pg_namespace n
        where (
          select count(*) from pg_class c
          where c.relnamespace = n.oid and c.relname in ('migrations', 'conversations') and c.relkind = 'r'
            and has_table_privilege(c.oid, 'select')
            -- Another application's migrations table (Laravel's, TypeORM's) has no applied_at: not the service's.
            and (c.relname <> 'migrations' or exists (
              select from pg_attribute a where a.attrelid = c.oid and a.attname = 'applied_at' and not a.attisdropped
            ))
        ) = 2
      )
      select quote_ident(current_schema()) as schema, quote_ident(current_user) as role, quote_ident(current_database()) as database,
        pg_is_in_recovery() as "inRecovery",
        current_setting('server_encoding') as encoding,
        (
          select bool_and(t at time zone current_setting('TimeZone') = t at time zone 'UTC')
          from generate_series(timestamptz '1970-01-01 00:00Z', timestamptz '2100-01-01 00:00Z', interval '1 month') as t
        ) as "utcZone",
        array(select name from service order by 1) as "tablesIn",
        array(select name from service where not has_schema_privilege(oid, 'usage') order by 1) as "withoutUsage"
    `,
    readRefused(sql),
  ])
  return { settings, ...row!, refused }
}

/**
 * What the role may not do of what the service does with its objects in the schema the migrations
 * create in (when the service's `migrations` table is there: before, they are not the service's):
 * select, insert, update and delete on every table, usage (or update: either lets nextval) of the
 * sequences their `bigserial` columns take from, execute on its functions (a database that revokes
 * it from PUBLIC), and row-level security, which no policy of the service's expects: reads missed
 * rows, writes were refused. Row-level security is no refusal where a permissive policy for all
 * commands, `using (true)`, applies to the role and no restrictive one narrows it (as on Supabase,
 * where every table of an exposed schema has it enabled). Not asked for what PostgreSQL does not check: an identity column's
 * sequence, and a trigger's function (execute is checked when the trigger is made, not when it fires).
 */
async function readRefused(sql: Sql): Promise<Refused[]> {
  const { tables, functions } = serviceObjects()
  return await sql<Refused[]>`
    with ours as (
      select c.oid, c.relname from pg_class c
      where c.relnamespace = (select oid from pg_namespace where nspname = current_schema()) and c.relkind in ('r', 'p') and c.relname = any(${tables})
        and exists (
          select from pg_class m join pg_attribute a on a.attrelid = m.oid
          where m.relnamespace = c.relnamespace and m.relname = 'migrations' and a.attname = 'applied_at' and not a.attisdropped
        )
    ), policies as (
      -- The policies applying to the role, and whether each lets every row through.
      select p.polrelid, p.polpermissive, p.polcmd = '*' as "everyCommand",
        pg_get_expr(p.polqual, p.polrelid) = 'true' and coalesce(pg_get_expr(p.polwithcheck, p.polrelid), 'true') = 'true' as open
      from pg_policy p
      where p.polrelid in (select oid from ours)
        and exists (select from unnest(p.polroles) r where case when r = 0 then true else pg_has_role(r, 'usage') end)
    ), used as (
      select 'table' as kind, format('%I.%I', current_schema(), relname) as name,
        row_security_active(oid) and (
          not exists (select from policies where polrelid = ours.oid and polpermissive and "everyCommand" and open)
          or exists (select from policies where polrelid = ours.oid and not polpermissive and not open)
        ) as "rowSecurity",
        array(select p from unnest(array['select', 'insert', 'update', 'delete']) p where not has_table_privilege(oid, p)) as missing
      from ours
      union all
      select 'sequence', format('%s.%I', s.relnamespace::regnamespace, s.relname), false, array(select 'usage' where not has_sequence_privilege(s.oid, 'usage, update'))
      from pg_depend d join pg_class s on s.oid = d.objid and s.relkind = 'S'
      where d.classid = 'pg_class'::regclass and d.refclassid = 'pg_class'::regclass and d.deptype = 'a'
        and d.refobjid in (select oid from ours)
      union all
      select 'function', format('%I.%I(%s)', current_schema(), p.proname, pg_get_function_identity_arguments(p.oid)), false,
        array(select 'execute' where not has_function_privilege(p.oid, 'execute'))
      from pg_proc p
      where p.pronamespace = (select oid from pg_namespace where nspname = current_schema()) and p.proname = any(${functions})
        and p.prorettype <> 'trigger'::regtype and exists (select from ours)
    )
    select * from used where cardinality(missing) > 0 or "rowSecurity"
    order by array_position(array['table', 'sequence', 'function'], kind), name
  `
}

/**
 * Why the service must not run in `session`, in one line naming the setting and the statement that
 * fixes it; null when it may. A startup parameter that a pooler drops (PgBouncer, for what its
 * ignore_startup_parameters lists: `default_transaction_isolation`, which it cannot track) leaves the
 * role's or the database's value in force, silently: under serializable, racing subscriptions were
 * 503s behind PgBouncer. A search_path with no schema that exists failed the migrations with `no
 * schema has been selected to create in`; one leading to a schema other than the tables' made the
 * migrations create every table anew there, empty, and the service served from those. A server or
 * a role that takes no writes (a replica's user given by mistake) booted, to answer every write 503;
 * it is not overridden at startup as the defaults are: a fenced old primary sets it so. A database
 * whose encoding is not UTF8 cannot hold what clients send: LATIN1 refused emoji and CJK as values
 * that "cannot be stored" (400), and SQL_ASCII counts the lengths its checks bound in bytes (a chat
 * message of 500 emoji, within the contract's 500 characters, was a 500).
 */
function sessionRefusal(session: Session): string | null {
  const { settings, utcZone, schema, tablesIn, withoutUsage, role, database, inRecovery, encoding, refused } = session
  if (inRecovery) return `DATABASE_URL leads to a server in recovery (a hot standby), which takes no writes: give it the primary's address`
  if (encoding !== 'UTF8') {
    const loss =
      encoding === 'SQL_ASCII'
        ? 'it counts lengths in bytes, so text within the limits (500 emoji in a chat message) fails, and it checks nothing it stores'
        : 'it cannot store every character clients send (emoji, CJK: refused as values that cannot be stored)'
    return (
      `the database ${database} has encoding ${encoding}, not UTF8: ${loss}; create one with encoding UTF8 ` +
      `(createdb -E UTF8 --locale=C -T template0 <name>), move the data there with pg_dump and pg_restore, and point DATABASE_URL to it`
    )
  }
  const levels: Record<string, string> = {
    user: `alter role ${role}`,
    database: `alter database ${database}`,
    'database user': `alter role ${role} in database ${database}`,
  }
  // Where the value is set, to reset it or set it there; else (the server's configuration) for the role.
  // A startup parameter other than the service's is DATABASE_URL's query (postgres.js sends it, after
  // its own): no alter outranks it.
  const where = (s: Setting) => levels[s.source]
  const inUrl = (s: Setting) => s.source === 'client'
  const set = (s: Setting, value: string) =>
    inUrl(s) ? `set ${s.name} = ${value} in DATABASE_URL` : `${where(s) ?? `alter role ${role}`} set ${s.name} = ${value}`
  const reset = (s: Setting) => (inUrl(s) ? `remove ${s.name} from DATABASE_URL` : where(s) && `${where(s)} reset ${s.name}`)
  const said = (s: Setting) =>
    `${s.name} = '${s.setting}' (${inUrl(s) ? 'set in DATABASE_URL' : where(s) ? `set by ${where(s)}` : `the server's ${s.source}`})`
  const readOnly = settings.find(s => s.name === 'default_transaction_read_only')!
  if (readOnly.setting === 'on') {
    return (
      `the database's sessions are read-only, ${said(readOnly)}, and the service writes: ` +
      (inUrl(readOnly)
        ? reset(readOnly)
        : where(readOnly)
          ? `${reset(readOnly)}, or give DATABASE_URL a role that may write`
          : `give DATABASE_URL the primary's address (a fenced old primary or a replica is configured so)`)
    )
  }
  for (const s of settings) {
    const wanted = sessionDefaults[s.name as keyof typeof sessionDefaults]
    if (wanted === undefined || s.setting === wanted || (s.name === 'TimeZone' && utcZone)) continue
    if (inUrl(s)) return `${s.name} = '${s.setting}' is set in DATABASE_URL, not the '${wanted}' the service needs: remove it from there`
    return (
      `the database's sessions have ${said(s)}, not the '${wanted}' the service sends at startup: a pooler drops it ` +
      `(PgBouncer, as ignore_startup_parameters lists it); ${reset(s) ?? set(s, `'${wanted}'`)}`
    )
  }
  const path = settings.find(s => s.name === 'search_path')!
  if (withoutUsage[0] && (schema === null || !tablesIn.includes(schema))) {
    return `DATABASE_URL's role ${role} may not use schema ${withoutUsage[0]}, which holds the service's tables: grant usage on schema ${withoutUsage[0]} to ${role}`
  }
  if (schema === null) {
    const fix = tablesIn[0] ? set(path, tablesIn[0]) : (reset(path) ?? set(path, '<a schema the role may create in>'))
    return `${said(path)} names no schema that exists, where the migrations create the service's tables: ${fix}`
  }
  if (tablesIn.length > 0 && !tablesIn.includes(schema)) {
    return (
      `${said(path)} leads to schema ${schema}, but the service's tables are in ${tablesIn.join(', ')} ` +
      `(the migrations would create them anew, empty, in ${schema}): ${set(path, tablesIn[0]!)}`
    )
  }
  return grantsRefusal(role, schema, refused)
}

/**
 * The grants (or the row-level security) that keep DATABASE_URL's role from the service's objects,
 * in one line with the statements that fix it; null when it may use them all. Without them a role
 * whose tables a later migration made (default privileges not set) booted, then answered 500.
 */
function grantsRefusal(role: string, schema: string, refused: Refused[]): string | null {
  const secured = refused.filter(r => r.rowSecurity).map(r => r.name)
  if (secured.length > 0) {
    return (
      `row-level security applies to DATABASE_URL's role ${role} on table ${secured.join(', ')}; the service reads ` +
      `and writes every row of its tables: alter table ${secured[0]} disable row level security` +
      `${secured.length > 1 ? ' (and the others)' : ''}, alter role ${role} bypassrls, or give it a policy that lets every ` +
      `row through and no restrictive one: create policy marketplace on ${secured[0]} for all to ${role} using (true)`
    )
  }
  const lacking = refused.filter(r => r.missing.length > 0)
  if (lacking.length === 0) return null
  // Named when a few (a migration's new table); else all of the schema's, as docs/operations.md lists.
  const grant = (kind: Refused['kind'], privileges: string) => {
    const names = lacking.filter(r => r.kind === kind).map(r => r.name)
    if (names.length === 0) return []
    const on = names.length <= 3 || kind === 'function' ? `${kind} ${names.join(', ')}` : `all ${kind}s in schema ${schema}`
    return [`grant ${privileges} on ${on} to ${role}`]
  }
  const said = lacking.slice(0, 3).map(r => `${r.missing.join(', ')} on ${r.kind} ${r.name}`)
  if (lacking.length > 3) said.push(`${lacking.length - 3} more`)
  return (
    `DATABASE_URL's role ${role} may not use all of the service's objects in schema ${schema} (lacking ${said.join('; ')}): ` +
    [...grant('table', 'select, insert, update, delete'), ...grant('sequence', 'usage'), ...grant('function', 'execute')].join('; ')
  )
}
