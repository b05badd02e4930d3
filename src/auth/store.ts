/** SQL for users and API keys. */
import type { Db } from '../db.ts'
import type { KeyKind } from './api-key.ts'
import type { TokenClaims } from './jwt.ts'
import type { KeyStatus } from './principal.ts'

/**
 * Not an event for a stream: the hex SHA-256 of a revoked API key, which the relay
 * (src/events/relay.ts) announces on the key-revoked channel so every API process evicts it
 * (written by the revocations below).
 */
export const keyRevokedType = 'key.revoked'

export interface UserRow {
  id: string
  providerId: string
  email: string | null
  walletAddress: string | null
  createdAt: Date
}

/** The user behind a token's subject, created on its first valid token. */
export async function upsertUser(sql: Db, claims: TokenClaims): Promise<string> {
  const [row] = await sql<{ id: string }[]>`
    insert into users (provider_id, email, wallet_address)
    values (${claims.sub}, ${claims.email}, ${claims.walletAddress})
    on conflict (provider_id) do update
      set email = coalesce(excluded.email, users.email)
      where users.email is distinct from coalesce(excluded.email, users.email)
    returning id
  `
  if (row) return row.id
  // Nothing changed, so nothing was returned: read the existing row.
  const [existing] = await sql<{ id: string }[]>`select id from users where provider_id = ${claims.sub}`
  return existing!.id
}

export async function getUser(sql: Db, id: string): Promise<UserRow | undefined> {
  const [row] = await sql<UserRow[]>`
    select id, provider_id as "providerId", email, wallet_address as "walletAddress", created_at as "createdAt"
    from users
    where id = ${id}
  `
  return row
}

/** Sets the wallet address; returns the profile as this update left it (not as a concurrent one did), or undefined. */
export async function setWalletAddress(sql: Db, id: string, walletAddress: string | null): Promise<UserRow | undefined> {
  const [row] = await sql<UserRow[]>`
    update users set wallet_address = ${walletAddress}
    where id = ${id}
    returning id, provider_id as "providerId", email, wallet_address as "walletAddress", created_at as "createdAt"
  `
  return row
}

export interface ApiKeyRow {
  id: string
  name: string
  prefix: string
  createdAt: Date
  lastUsedAt: Date | null
}

export async function insertApiKey(sql: Db, key: { kind: KeyKind; owner: string; name: string; prefix: string; hash: Buffer }): Promise<ApiKeyRow> {
  const [row] = await sql<ApiKeyRow[]>`
    insert into api_keys (kind, user_id, participant_id, name, prefix, key_hash)
    values (
      ${key.kind},
      ${key.kind === 'user' ? key.owner : null},
      ${key.kind === 'agent' ? key.owner : null},
      ${key.name},
      ${key.prefix},
      ${key.hash}
    )
    returning id, name, prefix, created_at as "createdAt", last_used_at as "lastUsedAt"
  `
  return row!
}

export async function listUserKeys(sql: Db, userId: string): Promise<ApiKeyRow[]> {
  return sql<ApiKeyRow[]>`
    select id, name, prefix, created_at as "createdAt", last_used_at as "lastUsedAt"
    from api_keys
    where user_id = ${userId} and kind = 'user' and revoked_at is null
    order by created_at desc, id
  `
}

/**
 * Revokes one of the user's live keys; returns its hash (to evict from caches) or undefined. The
 * same statement puts the revocation in the outbox: every instance hears of it once it commits,
 * even when the caller's own announcement (KeyCache.revoke) cannot reach Redis.
 */
export async function revokeUserKey(sql: Db, userId: string, keyId: string): Promise<Buffer | undefined> {
  const [row] = await sql<{ keyHash: Buffer }[]>`
    with revoked as (
      update api_keys set revoked_at = now()
      where id = ${keyId} and user_id = ${userId} and kind = 'user' and revoked_at is null
      returning key_hash
    ), announced as (
      insert into outbox (user_id, type, data)
      select null, ${keyRevokedType}, encode(key_hash, 'hex') from revoked
    )
    select key_hash as "keyHash" from revoked
  `
  return row?.keyHash
}

/** Revokes an agent's live key(s), each put in the outbox as revokeUserKey does; returns their hashes. */
export async function revokeAgentKeys(sql: Db, participantId: string): Promise<Buffer[]> {
  const rows = await sql<{ keyHash: Buffer }[]>`
    with revoked as (
      update api_keys set revoked_at = now()
      where participant_id = ${participantId} and kind = 'agent' and revoked_at is null
      returning key_hash
    ), announced as (
      insert into outbox (user_id, type, data)
      select null, ${keyRevokedType}, encode(key_hash, 'hex') from revoked
    )
    select key_hash as "keyHash" from revoked
  `
  return rows.map(row => row.keyHash)
}

/** What a key's hash stands for: the principal a live key acts as, `revoked` (agent keys of deactivated agents too), or `unknown`. */
export async function findKeyStatus(sql: Db, hash: Buffer): Promise<KeyStatus> {
  const [row] = await sql<
    { id: string; kind: KeyKind; userId: string | null; participantId: string | null; ownerId: string | null; live: boolean }[]
  >`
    select k.id, k.kind, k.user_id as "userId", k.participant_id as "participantId", p.owner_id as "ownerId",
      k.revoked_at is null and (k.kind = 'user' or p.active) as live
    from api_keys k
    left join participants p on p.id = k.participant_id
    where k.key_hash = ${hash}
  `
  if (!row) return 'unknown'
  if (!row.live) return 'revoked'
  if (row.kind === 'user') return { kind: 'user', userId: row.userId!, keyId: row.id }
  return { kind: 'agent', participantId: row.participantId!, ownerId: row.ownerId!, keyId: row.id }
}

/**
 * Records the keys' use at `at`, except on rows written less than `everyMs` before it (by another
 * process's flush, say): `lastUsedAt` is kept to about that, so a key polled without pause costs its
 * row one update in that time, however many processes serve it.
 */
export async function touchKeys(sql: Db, ids: string[], at: Date, everyMs: number): Promise<void> {
  await sql`
    update api_keys set last_used_at = ${at}
    where id = any(${ids}::uuid[])
      and (last_used_at is null or last_used_at <= ${at}::timestamptz - make_interval(secs => ${everyMs / 1000}))
  `
}
