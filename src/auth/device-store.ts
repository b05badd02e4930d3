/** SQL for device authorizations. */
import { deleteOlderThan, type Db, type Sql } from '../db.ts'

export type DeviceStatus = 'pending' | 'approved' | 'denied' | 'delivered'

export interface DeviceCodeRow {
  deviceCode: string
  status: DeviceStatus
  userId: string | null
  expiresAt: Date
}

/** Inserts a pending authorization; undefined when the user code is already pending elsewhere. */
export async function insertDeviceCode(sql: Db, row: { userCode: string; createdAt: Date; expiresAt: Date }): Promise<string | undefined> {
  const [inserted] = await sql<{ deviceCode: string }[]>`
    insert into device_codes (user_code, created_at, expires_at)
    values (${row.userCode}, ${row.createdAt}, ${row.expiresAt})
    on conflict (user_code) where status = 'pending' do nothing
    returning device_code as "deviceCode"
  `
  return inserted?.deviceCode
}

export async function findDeviceCode(sql: Db, deviceCode: string): Promise<DeviceCodeRow | undefined> {
  const [row] = await sql<DeviceCodeRow[]>`
    select device_code as "deviceCode", status, user_id as "userId", expires_at as "expiresAt"
    from device_codes
    where device_code = ${deviceCode}
  `
  return row
}

/** Marks an approved authorization delivered, once; returns who approved it. */
export async function markDelivered(sql: Db, deviceCode: string, at: Date): Promise<string | undefined> {
  const [row] = await sql<{ userId: string }[]>`
    update device_codes set status = 'delivered', delivered_at = ${at}
    where device_code = ${deviceCode} and status = 'approved'
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
