/** SQL for connected accounts; credentials arrive and leave sealed. */
import type { Db } from '../db.ts'

export interface ConnectionRow {
  id: string
  provider: string
  baseUrl: string
  label: string | null
  createdAt: Date
}

const columns = (sql: Db) => sql`id, provider, base_url as "baseUrl", label, created_at as "createdAt"`

/** Inserts a connection; undefined when the user already has one for the provider. */
export async function insertConnection(
  sql: Db,
  row: { id: string; userId: string; provider: string; baseUrl: string; label: string | null; credential: Buffer; at: Date },
): Promise<ConnectionRow | undefined> {
  const [inserted] = await sql<ConnectionRow[]>`
    insert into connections (id, user_id, provider, base_url, label, credential, created_at)
    values (${row.id}, ${row.userId}, ${row.provider}, ${row.baseUrl}, ${row.label}, ${row.credential}, ${row.at})
    on conflict (user_id, provider) do nothing
    returning ${columns(sql)}
  `
  return inserted
}

export async function listConnections(sql: Db, userId: string): Promise<ConnectionRow[]> {
  return sql<ConnectionRow[]>`select ${columns(sql)} from connections where user_id = ${userId} order by created_at, id`
}

export async function deleteConnection(sql: Db, userId: string, id: string): Promise<boolean> {
  const rows = await sql`delete from connections where id = ${id} and user_id = ${userId} returning 1`
  return rows.length === 1
}

export async function findSealedConnection(sql: Db, userId: string, provider: string): Promise<(ConnectionRow & { credential: Buffer }) | undefined> {
  const [row] = await sql<(ConnectionRow & { credential: Buffer })[]>`
    select ${columns(sql)}, credential from connections where user_id = ${userId} and provider = ${provider}
  `
  return row
}

/** A page of sealed credentials in id order, after `afterId` (from the first with null): what a re-seal walks. */
export async function sealedCredentialsAfter(sql: Db, afterId: string | null, limit: number): Promise<{ id: string; credential: Buffer }[]> {
  return sql<{ id: string; credential: Buffer }[]>`
    select id, credential from connections
    where ${afterId === null ? sql`true` : sql`id > ${afterId}`}
    order by id
    limit ${limit}
  `
}

/**
 * Replaces a connection's sealed credential, only if it is still `sealed`: a connection deleted, or
 * sealed again by another run, meanwhile is left as it is. Whether it was replaced.
 */
export async function replaceSealedCredential(sql: Db, id: string, sealed: Buffer, resealed: Buffer): Promise<boolean> {
  const rows = await sql`update connections set credential = ${resealed} where id = ${id} and credential = ${sealed} returning 1`
  return rows.length === 1
}
