/** Metering a proxy call that reached its upstream: queue the usage event, and answer the live usage. */
import type { Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Queues } from '../queues.ts'
import { ensurePeriods, periodUsage } from '../billing/subscriptions/store.ts'
import { periodIndexAt } from '../billing/periods.ts'
import { countLive } from './usage-counter.ts'
import { recordUsage, type UsageEvent } from './count.ts'
import { errors } from '../errors.ts'

export interface Usage {
  periodCalls: number
  includedProxyCalls: number
  overageCalls: number
}

const week = 7 * 86_400_000

export async function meterCall(
  deps: { sql: Sql; redis: Redis; keys: Keys; queues: Queues },
  call: { eventId: string; subscription: { id: string; startedAt: Date }; occurredAt: Date },
): Promise<Usage> {
  const { sql, queues } = deps
  const periodIndex = periodIndexAt(call.subscription.startedAt, call.occurredAt)
  await ensurePeriods(sql, call.occurredAt, call.subscription.id)
  const period = await periodUsage(sql, call.subscription.id, periodIndex)
  // Cancelled between the check and now: the call still counts, in the period it was cancelled in.
  if (!period) throw errors.notSubscribed()
  const event: UsageEvent = {
    eventId: call.eventId,
    subscriptionId: call.subscription.id,
    periodIndex,
    occurredAt: call.occurredAt.toISOString(),
  }
  // Recorded before the answer, so that no loss of the queue loses it (sql/00019); counted later.
  await recordUsage(sql, event)
  // The job id is the event id: a repeat while the first is queued is dropped here, later ones by the table's key.
  await queues.metering.add('usage', event, {
    jobId: call.eventId,
    attempts: 25,
    backoff: { type: 'exponential', delay: 1000 },
    removeOnComplete: true,
    removeOnFail: false,
  })
  const periodCalls = await countLive(deps, {
    eventId: call.eventId,
    subscriptionId: call.subscription.id,
    periodIndex,
    seed: period.proxyCalls,
    ttlMs: Math.max(0, period.periodEnd.getTime() - call.occurredAt.getTime()) + week,
  })
  return {
    periodCalls,
    includedProxyCalls: period.includedProxyCalls,
    overageCalls: Math.max(0, periodCalls - period.includedProxyCalls),
  }
}
