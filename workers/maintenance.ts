/**
 * The maintenance queue: counts usage whose metering job was lost, expires service requests after
 * 24 h, forgets device authorizations a day after they expired, and drops idempotency records past
 * any replay window.
 */
import type { Deps } from '../src/deps.ts'
import { purgeDeviceCodes } from '../src/auth/device-store.ts'
import { purgeIdempotencyKeys } from '../src/idempotency/idempotent.ts'
import { purgeAppliedCommands } from '../src/actors/store.ts'
import { expireRequests } from '../src/service-requests/store.ts'
import { removeOpenRequest } from '../src/conversations/inbox.ts'
import { countUncounted } from '../src/metering/count.ts'

export const maintenanceEveryMs = 60_000

export async function runMaintenance(deps: Deps) {
  const { sql, clock, log } = deps
  const now = clock.now()
  // A call's usage still uncounted a minute after it was recorded lost its job (Redis lost its data):
  // counted here, so its thresholds are told now rather than at the invoice run.
  const usage = { counted: 0, late: 0 }
  for (let pass; (pass = await countUncounted(sql, new Date(now.getTime() - 60_000), now)).counted > 0;) {
    usage.counted += pass.counted
    usage.late += pass.late
  }
  if (usage.late > 0) log.error('usage counted into an invoiced period', { events: usage.late })
  const expired = await expireRequests(sql, now)
  // The inbox entry goes too; an agent's poll already hides expired requests, this only frees memory.
  for (const request of expired) await removeOpenRequest(deps, request.targetAgentId, request.requestId)
  const deviceCodes = await purgeDeviceCodes(sql, new Date(now.getTime() - 86_400_000))
  const idempotencyKeys = await purgeIdempotencyKeys(sql, now)
  // Twice the Idempotency-Key window: a retried command must still find its first result.
  const appliedCommands = await purgeAppliedCommands(sql, new Date(now.getTime() - 2 * 86_400_000))
  const counts = { usageEvents: usage.counted, serviceRequests: expired.length, deviceCodes, idempotencyKeys, appliedCommands }
  if (Object.values(counts).some(count => count > 0)) log.info('maintenance', counts)
  return counts
}
