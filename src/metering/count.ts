/** Counting usage events into their period, exactly once each, and recording the 80 % and 100 % thresholds. */
import { Type, type Static } from '@sinclair/typebox'
import type { Db, Sql } from '../db.ts'
import { ensurePeriods } from '../billing/subscriptions/store.ts'
import { enqueueEvents } from '../events/outbox.ts'

export const UsageEvent = Type.Object({
  eventId: Type.String({ format: 'uuid' }),
  subscriptionId: Type.String({ format: 'uuid' }),
  periodIndex: Type.Integer({ minimum: 0 }),
  occurredAt: Type.String({ format: 'date-time' }),
})
export type UsageEvent = Static<typeof UsageEvent>

export const thresholds = [80, 100] as const

export interface Counted {
  counted: boolean
  /** Counted into a period already invoiced: this call is on no invoice (an operator must see to it). */
  late?: boolean
}

/** Records the event, uncounted, unless it is there already: what the API does before it answers a call that reached its upstream. */
export async function recordUsage(sql: Db, event: UsageEvent): Promise<void> {
  await sql`
    insert into usage_events (id, subscription_id, period_index, occurred_at)
    values (${event.eventId}, ${event.subscriptionId}, ${event.periodIndex}, ${event.occurredAt})
    on conflict (id) do nothing
  `
}

/** Counts the event unless it was counted before (recorded or not); records `usage.threshold` events for the thresholds it crossed. */
export async function countUsage(sql: Sql, event: UsageEvent, at: Date): Promise<Counted> {
  return sql.begin(async tx => {
    await ensurePeriods(tx, new Date(event.occurredAt), event.subscriptionId)
    // The row's lock orders two counts of one event (the queue's job and a sweep): the second finds it counted.
    const counted = await tx`
      insert into usage_events (id, subscription_id, period_index, occurred_at, counted_at)
      values (${event.eventId}, ${event.subscriptionId}, ${event.periodIndex}, ${event.occurredAt}, ${at})
      on conflict (id) do update set counted_at = excluded.counted_at where usage_events.counted_at is null
      returning 1
    `
    if (counted.length === 0) return { counted: false }
    const [period] = await tx<{ calls: number; included: number; invoiced: boolean }[]>`
      update subscription_periods set proxy_calls = proxy_calls + 1
      where subscription_id = ${event.subscriptionId} and period_index = ${event.periodIndex}
      returning proxy_calls as calls, included_proxy_calls as included, invoice_id is not null as invoiced
    `
    const percents = thresholds.filter(percent => {
      const limit = Math.ceil((period!.included * percent) / 100)
      return period!.included > 0 && period!.calls >= limit && period!.calls - 1 < limit
    })
    for (const percent of percents) {
      const recorded = await tx`
        insert into usage_thresholds (subscription_id, period_index, percent, reached_at)
        values (${event.subscriptionId}, ${event.periodIndex}, ${percent}, ${at})
        on conflict do nothing
        returning 1
      `
      if (recorded.length === 0) continue
      const [who] = await tx<{ userId: string; ownerId: string; participantId: string }[]>`
        select s.user_id as "userId", a.owner_id as "ownerId", a.id as "participantId"
        from subscriptions s join participants a on a.id = s.participant_id
        where s.id = ${event.subscriptionId}
      `
      const payload = { subscriptionId: event.subscriptionId, periodIndex: event.periodIndex, participantId: who!.participantId, percent }
      await enqueueEvents(tx, at, [
        { userId: who!.userId, type: 'usage.threshold', payload },
        { userId: who!.ownerId, type: 'usage.threshold', payload },
      ])
    }
    return { counted: true, ...(period!.invoiced ? { late: true } : {}) }
  })
}

/**
 * Counts the recorded events that occurred before `before` and are still uncounted (their jobs lost
 * with Redis, or not yet run), oldest first, `limit` at most: how many it counted, and how many of
 * those went into periods already invoiced.
 */
export async function countUncounted(sql: Sql, before: Date, at: Date, limit = 1000): Promise<{ counted: number; late: number }> {
  const events = await sql<(Omit<UsageEvent, 'occurredAt'> & { occurredAt: Date })[]>`
    select id as "eventId", subscription_id as "subscriptionId", period_index as "periodIndex", occurred_at as "occurredAt"
    from usage_events where counted_at is null and occurred_at < ${before}
    order by occurred_at limit ${limit}
  `
  const done = { counted: 0, late: 0 }
  for (const event of events) {
    const result = await countUsage(sql, { ...event, occurredAt: event.occurredAt.toISOString() }, at)
    if (result.counted) done.counted++
    if (result.late) done.late++
  }
  return done
}
