/** The maintenance queue: forgets device authorizations a day after they expired, and old idempotency keys. */
import type { Deps } from '../src/deps.ts'
import { purgeDeviceCodes } from '../src/auth/device-store.ts'
import { purgeIdempotencyKeys } from '../src/idempotency/idempotent.ts'

export const maintenanceQueue = 'maintenance'
export const maintenanceEveryMs = 3_600_000

export async function runMaintenance({ sql, clock, log }: Deps) {
  const now = clock.now()
  const deviceCodes = await purgeDeviceCodes(sql, new Date(now.getTime() - 86_400_000))
  const idempotencyKeys = await purgeIdempotencyKeys(sql, now)
  if (deviceCodes + idempotencyKeys > 0) log.info('maintenance purged', { deviceCodes, idempotencyKeys })
  return { deviceCodes, idempotencyKeys }
}
