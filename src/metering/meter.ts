/** Metering a proxy call that reached its upstream: queue the usage event, and answer the live usage. */
import type { Sql } from '../db.ts'
import type { Queues } from '../queues.ts'
import { ensurePeriodsPastRun, periodUsage } from '../billing/subscriptions/store.ts'
import { periodIndexAt } from '../billing/periods.ts'
import { countLive, type CounterDeps } from '../billing/subscriptions/usage-counter.ts'
import { recordUsage, type UsageEvent } from './count.ts'
import { errorFields, type Log } from '../log.ts'

export interface Usage {
  periodCalls: number
  includedProxyCalls: number
  overageCalls: number
}

const week = 7 * 86_400_000

export async function meterCall(
  deps: CounterDeps & { sql: Sql; queues: Queues; log: Log },
  call: { eventId: string; subscription: { id: string; startedAt: Date }; occurredAt: Date },
): Promise<Usage> {
  const { sql, queues } = deps
  const wanted = periodIndexAt(call.subscription.startedAt, call.occurredAt)
  // Cancelled between the check and now: the call still counts, in the period it was cancelled in.
  let period = await periodUsage(sql, call.subscription.id, wanted)
  if (period?.periodIndex !== wanted) {
    // A call's first in a new period: a 503 while the invoice run makes it would leave the call,
    // which the upstream has had, unbilled (ensurePeriodsPastRun).
    await ensurePeriodsPastRun(sql, call.occurredAt, call.subscription.id)
    period = await periodUsage(sql, call.subscription.id, wanted)
  }
  if (!period) throw new Error(`subscription ${call.subscription.id} has no period at ${call.occurredAt.toISOString()}`)
  const { periodIndex } = period
  const event: UsageEvent = {
    eventId: call.eventId,
    subscriptionId: call.subscription.id,
    periodIndex,
    occurredAt: call.occurredAt.toISOString(),
  }
  // Recorded before the answer, so that no loss of the queue loses it (sql/00019); counted later.
  await recordUsage(sql, event)
  // From here nothing fails the call: it is billed, and a retry without a key would be billed again.
  // The job brings the count on sooner (its id the event's: a repeat while it is queued is dropped);
  // lost or never added, maintenance counts the event a minute later.
  // Queued beside the live count below: one round trip for both.
  const queued = queues.metering
    .add('usage', event, {
      jobId: call.eventId,
      attempts: 25,
      backoff: { type: 'exponential', delay: 1000 },
      removeOnComplete: true,
      // Kept a week to be looked into (maintenance has counted its call by then), not for ever.
      removeOnFail: { age: 7 * 86_400 },
    })
    .catch(error => deps.log.warn('metering job not queued; maintenance counts the call', { eventId: call.eventId, ...errorFields(error) }))
  const live = { eventId: call.eventId, subscriptionId: call.subscription.id, periodIndex, seed: period.proxyCalls }
  const ttlMs = Math.max(0, period.periodEnd.getTime() - call.occurredAt.getTime()) + week
  // With Redis away, the live count is Postgres's (what is counted so far), this call added.
  const periodCalls = await countLive(deps, { ...live, ttlMs }).catch(() => period.proxyCalls + 1)
  await queued
  return {
    periodCalls,
    includedProxyCalls: period.includedProxyCalls,
    overageCalls: Math.max(0, periodCalls - period.includedProxyCalls),
  }
}
