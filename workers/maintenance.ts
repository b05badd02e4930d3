/**
 * The maintenance queue: counts usage whose metering job was lost, expires service requests after
 * 24 h, forgets device authorizations a day after they expired, and drops idempotency records past
 * any replay window.
 */
import type { Deps } from '../src/deps.ts'
import { errorFields } from '../src/log.ts'
import { purgeDeviceCodes } from '../src/auth/device-store.ts'
import { purgeIdempotencyKeys } from '../src/idempotency/idempotent.ts'
import { appliedCommandsKeptMs, purgeAppliedCommands } from '../src/actors/store.ts'
import { expireRequests } from '../src/service-requests/store.ts'
import { removeOpenRequest } from '../src/conversations/inbox.ts'
import { countRecordedBefore } from '../src/metering/count.ts'

export const maintenanceEveryMs = 60_000

export async function runMaintenance(deps: Deps) {
  const { sql, clock, log } = deps
  const now = clock.now()
  const usage = await countLostUsage(deps, now)
  const expired = await expireOpenRequests(deps, now)
  const deviceCodes = await purgeDeviceCodes(sql, new Date(now.getTime() - 86_400_000))
  const idempotencyKeys = await purgeIdempotencyKeys(sql, now)
  const appliedCommands = await purgeAppliedCommands(sql, new Date(now.getTime() - appliedCommandsKeptMs))
  const counts = { usageEvents: usage, serviceRequests: expired, deviceCodes, idempotencyKeys, appliedCommands }
  if (Object.values(counts).some(count => count > 0)) log.info('maintenance', counts)
  return counts
}

/**
 * Marks the service requests past their 24 h expired and drops their inbox entries in Redis (an
 * agent's poll already hides expired requests; this frees the memory). The entries go before the
 * expiry commits: a Redis refusal midway leaves both to the next run, where an entry dropped after
 * the commit would stay in the inbox until it is next rebuilt, for good as a rule. A failure is
 * logged and the rest of maintenance goes on.
 */
async function expireOpenRequests(deps: Deps, now: Date): Promise<number> {
  try {
    return await deps.sql.begin(async tx => {
      const expired = await expireRequests(tx, now)
      // All at once, not one round trip after another while the transaction holds their rows.
      await Promise.all(expired.map(request => removeOpenRequest(deps, request.targetAgentId, request.requestId)))
      return expired.length
    })
  } catch (error) {
    deps.log.warn('expiring service requests failed; the next maintenance run goes on', errorFields(error))
    return 0
  }
}

/**
 * Counts usage still uncounted a minute after it was recorded: its job was lost (Redis lost its
 * data), so its thresholds are told now rather than at the invoice run. At most 20 batches of 1,000
 * a run, so the rest of maintenance is not held up by a large loss (the next run goes on); a failure
 * is logged and left to the next run.
 */
async function countLostUsage({ sql, log }: Deps, now: Date): Promise<number> {
  try {
    const { counted, late } = await countRecordedBefore(sql, new Date(now.getTime() - 60_000), now, { batches: 20 })
    if (late > 0) log.error('usage counted into an invoiced period', { events: late })
    return counted
  } catch (error) {
    log.warn('counting lost usage failed; the next maintenance run goes on', errorFields(error))
    return 0
  }
}
