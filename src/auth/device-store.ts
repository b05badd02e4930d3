/** SQL for device authorizations. */
import { deleteOlderThan, type Db, type Sql } from '../db.ts'

export type DeviceStatus = 'pending' | 'approved' | 'denied' | 'delivered'

export interface DeviceCodeRow {
  status: DeviceStatus
  userId: string | null
  expiresAt: Date
}

/**
 * Inserts a pending authorization, known by its device code's hash alone; false when the user code
 * is already pending elsewhere. device_code is written null: its default (a code as the previous
 * release handed it out) would be one that release's polls accept.
 */
export async function insertDeviceCode(sql: Db, row: { codeHash: Buffer; userCode: string; createdAt: Date; expiresAt: Date }): Promise<boolean> {
  const inserted = await sql`
    insert into device_codes (device_code, device_code_hash, user_code, created_at, expires_at)
    values (null, ${row.codeHash}, ${row.userCode}, ${row.createdAt}, ${row.expiresAt})
    on conflict (user_code) where status = 'pending' do nothing
    returning 1
  `
  return inserted.length === 1
}

export async function findDeviceCode(sql: Db, codeHash: Buffer): Promise<DeviceCodeRow | undefined> {
  const [row] = await sql<DeviceCodeRow[]>`
    select status, user_id as "userId", expires_at as "expiresAt"
    from device_codes
    where device_code_hash = ${codeHash}
  `
  return row
}

/** Marks an approved authorization delivered, once; returns who approved it. */
export async function markDelivered(sql: Db, codeHash: Buffer, at: Date): Promise<string | undefined> {
  const [row] = await sql<{ userId: string }[]>`
    update device_codes set status = 'delivered', delivered_at = ${at}
    where device_code_hash = ${codeHash} and status = 'approved'
    returning user_id as "userId"
  `
  return row?.userId
}

/**
 * Approves or denies a pending, unexpired authorization by its user code. True also when this user
 * already made this same decision on it (a repeated or concurrent click), before it expired.
 */
export async function decideDeviceCode(
  sql: Db,
  userCode: string,
  decision: { status: 'approved' | 'denied'; userId: string; at: Date },
): Promise<boolean> {
  const rows = await sql`
    update device_codes
    set status = ${decision.status}, user_id = ${decision.userId}, decided_at = ${decision.at}
    where user_code = ${userCode} and status = 'pending' and expires_at > ${decision.at}
    returning 1
  `
  if (rows.length === 1) return true
  const [same] = await sql`
    select 1 from device_codes
    where user_code = ${userCode} and status = ${decision.status} and user_id = ${decision.userId}
      and expires_at > ${decision.at}
  `
  return same !== undefined
}

/** Forgets authorizations that ended long enough ago that no device still polls them. */
export function purgeDeviceCodes(sql: Sql, olderThan: Date): Promise<number> {
  return deleteOlderThan(sql, 'device_codes', 'expires_at', olderThan)
}
