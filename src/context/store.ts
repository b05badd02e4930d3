/** SQL for organizations and their append-only context entries. */
import type { Db } from '../db.ts'
import type { ContextEntry, ContextType } from './schema.ts'

interface EntryRow {
  type: ContextType
  key: string
  data: Record<string, unknown>
  confidence: ContextEntry['confidence']
  version: number
  source: { method: string } | null
  authorKind: 'agent' | 'user'
  authorId: string
  createdAt: Date
}

const toEntry = (row: EntryRow): ContextEntry => ({
  type: row.type,
  key: row.key,
  data: row.data,
  confidence: row.confidence,
  version: row.version,
  source: row.source,
  author: { kind: row.authorKind, id: row.authorId },
  createdAt: row.createdAt.toISOString(),
})

const columns = (sql: Db) => sql`
  type, key, data, confidence, version, source, author_kind as "authorKind", author_id as "authorId",
  created_at as "createdAt"
`

/** The user's organization, created on first use. */
export async function ensureOrganization(sql: Db, userId: string, at: Date): Promise<string> {
  const [created] = await sql<{ id: string }[]>`
    insert into organizations (user_id, created_at) values (${userId}, ${at})
    on conflict (user_id) do nothing
    returning id
  `
  if (created) return created.id
  return (await findOrganization(sql, userId))!
}

export async function findOrganization(sql: Db, userId: string): Promise<string | undefined> {
  const [row] = await sql<{ id: string }[]>`select id from organizations where user_id = ${userId}`
  return row?.id
}

export async function organizationOwner(sql: Db, orgId: string): Promise<string | undefined> {
  const [row] = await sql<{ userId: string }[]>`select user_id as "userId" from organizations where id = ${orgId}`
  return row?.userId
}

/** The newest version of each matching entry, ordered by type then key. */
export async function newestEntries(sql: Db, orgId: string, filter: { type?: ContextType; key?: string }): Promise<ContextEntry[]> {
  const rows = await sql<EntryRow[]>`
    select distinct on (type, key) ${columns(sql)}
    from context_entries
    where org_id = ${orgId}
      and (${filter.type ?? null}::text is null or type = ${filter.type ?? null})
      and (${filter.key ?? null}::text is null or key = ${filter.key ?? null})
    order by type, key, version desc
  `
  return rows.map(toEntry)
}

export async function entryVersions(sql: Db, orgId: string, type: ContextType, key: string): Promise<ContextEntry[]> {
  const rows = await sql<EntryRow[]>`
    select ${columns(sql)} from context_entries
    where org_id = ${orgId} and type = ${type} and key = ${key}
    order by version desc
  `
  return rows.map(toEntry)
}

export async function entryVersion(
  sql: Db,
  orgId: string,
  entry: { type: ContextType; key: string; version: number },
): Promise<ContextEntry | undefined> {
  const [row] = await sql<EntryRow[]>`
    select ${columns(sql)} from context_entries
    where org_id = ${orgId} and type = ${entry.type} and key = ${entry.key} and version = ${entry.version}
  `
  return row ? toEntry(row) : undefined
}

/** The newest version (by the primary key, read backwards). */
export async function newestVersion(sql: Db, orgId: string, entry: { type: ContextType; key: string }): Promise<ContextEntry | undefined> {
  const [row] = await sql<EntryRow[]>`
    select ${columns(sql)} from context_entries
    where org_id = ${orgId} and type = ${entry.type} and key = ${entry.key}
    order by version desc
    limit 1
  `
  return row ? toEntry(row) : undefined
}

export async function insertVersion(
  sql: Db,
  orgId: string,
  entry: Omit<ContextEntry, 'createdAt' | 'author'> & { author: ContextEntry['author']; at: Date },
): Promise<ContextEntry> {
  const [row] = await sql<EntryRow[]>`
    insert into context_entries (org_id, type, key, version, data, confidence, source, author_kind, author_id, created_at)
    values (
      ${orgId}, ${entry.type}, ${entry.key}, ${entry.version}, ${sql.json(entry.data as never)}, ${entry.confidence},
      ${entry.source ? sql.json(entry.source as never) : null}, ${entry.author.kind}, ${entry.author.id}, ${entry.at}
    )
    returning ${columns(sql)}
  `
  return toEntry(row!)
}
