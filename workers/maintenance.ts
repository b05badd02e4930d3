/** The maintenance queue: forgets device authorizations a day after they expired. */
import type { Deps } from '../src/deps.ts'
import { purgeDeviceCodes } from '../src/auth/device-store.ts'

export const maintenanceQueue = 'maintenance'
export const maintenanceEveryMs = 3_600_000

export async function runMaintenance({ sql, clock, log }: Deps): Promise<{ deviceCodes: number }> {
  const deviceCodes = await purgeDeviceCodes(sql, new Date(clock.now().getTime() - 86_400_000))
  if (deviceCodes > 0) log.info('purged device codes', { deviceCodes })
  return { deviceCodes }
}
