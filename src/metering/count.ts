/** Counting usage events into their period, exactly once each, and recording the 80 % and 100 % thresholds. */
import { Type, type Static } from '@sinclair/typebox'
import type { Db, Sql } from '../db.ts'
import { enqueueEvents } from '../events/outbox.ts'

export const UsageEvent = Type.Object({
  eventId: Type.String({ format: 'uuid' }),
  subscriptionId: Type.String({ format: 'uuid' }),
  periodIndex: Type.Integer({ minimum: 0 }),
  occurredAt: Type.String({ format: 'date-time' }),
})
export type UsageEvent = Static<typeof UsageEvent>

export const thresholds = [80, 100] as const

/** Records the event to be counted: what the API does before it answers a call that reached its upstream (its period's row exists). */
export async function recordUsage(sql: Db, event: UsageEvent): Promise<void> {
  await sql`
    insert into usage_uncounted (id, subscription_id, period_index, occurred_at)
    values (${event.eventId}, ${event.subscriptionId}, ${event.periodIndex}, ${event.occurredAt})
    on conflict (id) do nothing
  `
}

export interface Counted {
  /** Recorded events this count took (each counted now, or found counted before). */
  taken: number
  /** Events counted now. */
  counted: number
  /** Of those, counted into periods already invoiced: on no invoice (an operator must see to them). */
  late: number
}

/** Which recorded events to count: some by id (a metering job's), or the oldest that occurred before a time. */
export type Recorded = { ids: string[] } | { before: Date; limit?: number }

/**
 * Counts recorded events into their periods in one transaction, and records the thresholds they
 * crossed (`usage.threshold` to the subscriber and the owner). Events another counter holds are
 * skipped, unless `wait` (the invoice run's last pass, which must see them counted). Each event moves
 * to `usage_events`, whose key counts it once whoever counts it; the periods are locked in one order,
 * so counters never wait on each other in a cycle.
 */
export async function countRecorded(sql: Sql, which: Recorded, at: Date, wait = false): Promise<Counted> {
  return sql.begin(async tx => {
    const filter = 'ids' in which ? tx`id = any(${which.ids}::uuid[])` : tx`occurred_at < ${which.before}`
    const limit = 'ids' in which ? which.ids.length : (which.limit ?? 1000)
    const [row] = await tx<{ taken: number; periods: { subscriptionId: string; periodIndex: number; k: number }[] }[]>`
      with picked as (
        select id from usage_uncounted where ${filter}
        order by occurred_at limit ${limit}
        for update ${wait ? tx`` : tx`skip locked`}
      ), taken as (
        delete from usage_uncounted u using picked p where u.id = p.id
        returning u.id, u.subscription_id, u.period_index, u.occurred_at
      ), inserted as (
        insert into usage_events (id, subscription_id, period_index, occurred_at, counted_at)
        select id, subscription_id, period_index, occurred_at, ${at} from taken
        on conflict (id) do nothing
        returning subscription_id, period_index
      )
      select (select count(*)::int from taken) as taken, coalesce((
        select json_agg(json_build_object('subscriptionId', subscription_id, 'periodIndex', period_index, 'k', k))
        from (select subscription_id, period_index, count(*)::int as k from inserted group by 1, 2) g
      ), '[]') as periods
    `
    const { taken, periods } = row!
    if (periods.length === 0) return { taken, counted: 0, late: 0 }
    return { taken, ...(await addToPeriods(tx, periods, at)) }
  })
}

/**
 * Counts the events recorded before `before`, batch after batch until a batch takes none (or
 * `batches` were done): the totals. `wait` as for `countRecorded`.
 */
export async function countRecordedBefore(sql: Sql, before: Date, at: Date, options: { wait?: boolean; batches?: number } = {}): Promise<Counted> {
  const total: Counted = { taken: 0, counted: 0, late: 0 }
  for (let batch = 0; batch < (options.batches ?? Infinity); batch++) {
    const pass = await countRecorded(sql, { before }, at, options.wait)
    total.taken += pass.taken
    total.counted += pass.counted
    total.late += pass.late
    if (pass.taken === 0) break
  }
  return total
}

/**
 * Adds each period's new calls, the periods locked in one order first (`no key update`, as the update
 * itself: the key-share locks the events' foreign keys take do not stand in its way); records the
 * thresholds crossed.
 */
async function addToPeriods(tx: Db, periods: { subscriptionId: string; periodIndex: number; k: number }[], at: Date) {
  const input = JSON.stringify(periods)
  await tx`
    select 1 from subscription_periods sp
    join json_to_recordset(${input}::text::json) as p("subscriptionId" uuid, "periodIndex" int, k int)
      on sp.subscription_id = p."subscriptionId" and sp.period_index = p."periodIndex"
    order by sp.subscription_id, sp.period_index
    for no key update of sp
  `
  const bumped = await tx<{ subscriptionId: string; periodIndex: number; calls: number; k: number; included: number; invoiced: boolean }[]>`
    update subscription_periods sp set proxy_calls = sp.proxy_calls + p.k
    from json_to_recordset(${input}::text::json) as p("subscriptionId" uuid, "periodIndex" int, k int)
    where sp.subscription_id = p."subscriptionId" and sp.period_index = p."periodIndex"
    returning sp.subscription_id as "subscriptionId", sp.period_index as "periodIndex", sp.proxy_calls as calls, p.k,
      sp.included_proxy_calls as included, sp.invoice_id is not null as invoiced
  `
  const crossed = bumped.flatMap(period =>
    thresholds
      .filter(percent => {
        const limit = Math.ceil((period.included * percent) / 100)
        return period.included > 0 && period.calls >= limit && period.calls - period.k < limit
      })
      .map(percent => ({ subscriptionId: period.subscriptionId, periodIndex: period.periodIndex, percent })),
  )
  if (crossed.length > 0) await announceThresholds(tx, crossed, at)
  const counted = bumped.reduce((n, period) => n + period.k, 0)
  const late = bumped.filter(period => period.invoiced).reduce((n, period) => n + period.k, 0)
  return { counted, late }
}

/** Records each threshold once, and tells the subscriber and the agent's owner of those recorded now. */
async function announceThresholds(tx: Db, crossed: { subscriptionId: string; periodIndex: number; percent: number }[], at: Date) {
  const recorded = await tx<
    { subscriptionId: string; periodIndex: number; percent: number; userId: string; ownerId: string; participantId: string }[]
  >`
    with recorded as (
      insert into usage_thresholds (subscription_id, period_index, percent, reached_at)
      select "subscriptionId", "periodIndex", percent, ${at}
      from json_to_recordset(${JSON.stringify(crossed)}::text::json) as c("subscriptionId" uuid, "periodIndex" int, percent int)
      on conflict do nothing
      returning subscription_id, period_index, percent
    )
    select r.subscription_id as "subscriptionId", r.period_index as "periodIndex", r.percent,
      s.user_id as "userId", a.owner_id as "ownerId", a.id as "participantId"
    from recorded r join subscriptions s on s.id = r.subscription_id join participants a on a.id = s.participant_id
  `
  await enqueueEvents(
    tx,
    at,
    recorded.flatMap(({ subscriptionId, periodIndex, percent, userId, ownerId, participantId }) => {
      const payload = { subscriptionId, periodIndex, participantId, percent }
      return [
        { userId, type: 'usage.threshold' as const, payload },
        { userId: ownerId, type: 'usage.threshold' as const, payload },
      ]
    }),
  )
}
