/** SQL for subscriptions and their periods. */
import type { Db, Sql } from '../../db.ts'

export interface SubscriptionRow {
  id: string
  planId: string
  participantId: string
  participantName: string
  planName: string
  status: 'active' | 'cancelled'
  periodIndex: number
  currentPeriodStart: Date
  currentPeriodEnd: Date
  proxyCalls: number
  includedProxyCalls: number
  createdAt: Date
  cancelledAt: Date | null
}

// The latest period row is the current one once ensurePeriods has run up to now.
const view = (sql: Db) => sql`
  select
    s.id, s.plan_id as "planId", s.participant_id as "participantId", a.name as "participantName",
    p.name as "planName", s.status, sp.period_index as "periodIndex", sp.period_start as "currentPeriodStart",
    sp.period_end as "currentPeriodEnd", sp.proxy_calls as "proxyCalls",
    sp.included_proxy_calls as "includedProxyCalls", s.created_at as "createdAt",
    s.cancelled_at as "cancelledAt", s.user_id
  from subscriptions s
  join plans p on p.id = s.plan_id
  join participants a on a.id = s.participant_id
  join lateral (
    select * from subscription_periods where subscription_id = s.id order by period_index desc limit 1
  ) sp on true
`

export interface NewSubscription {
  userId: string
  participantId: string
  planId: string
  startedAt: Date
}

/**
 * Inserts an active subscription and its first period; the unique index refuses a second active one.
 * The user's subscriptions are made one at a time (a lock of the user's, to the end of the
 * transaction), each dated at least a millisecond after the user's newest: the list, paged by
 * `before` (strictly older), then skips none of those made at once. Its periods run from `startedAt`.
 */
export async function insertSubscription(sql: Db, s: NewSubscription): Promise<string> {
  // Sent together, the lock first: no round trip of its own (`execute`: sent before the insert).
  const [, [row]] = await Promise.all([
    sql`select pg_advisory_xact_lock(hashtextextended(${`subscriptions-of:${s.userId}`}, 0))`.execute(),
    sql<{ id: string }[]>`
      with dated as (
        select greatest(
          ${s.startedAt}::timestamptz,
          (select max(created_at) from subscriptions where user_id = ${s.userId}) + interval '1 millisecond'
        ) as at
      )
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select ${s.userId}, ${s.participantId}, ${s.planId}, 'active', ${s.startedAt}, dated.at
      from dated
      returning id
    `,
  ])
  await ensurePeriods(sql, s.startedAt, row!.id)
  return row!.id
}

export interface PeriodTerms {
  monthlyPriceCents: number
  includedProxyCalls: number
  overagePerCallCents: number
}

/** The terms a subscription's first period was given. */
export async function firstPeriodTerms(sql: Db, subscriptionId: string): Promise<PeriodTerms> {
  const [row] = await sql<PeriodTerms[]>`
    select monthly_price_cents as "monthlyPriceCents", included_proxy_calls as "includedProxyCalls",
      overage_per_call_cents as "overagePerCallCents"
    from subscription_periods where subscription_id = ${subscriptionId} and period_index = 0
  `
  return row!
}

/**
 * Creates the missing rows of every period that has begun by `at` (for a cancelled subscription, up
 * to the period it was cancelled in), with their terms, and counts them; one subscription, several
 * (a list page), or all of them (the invoice run), in one statement. The first period has the terms in
 * force at its start. A later one has, term by term, the best for the subscriber of those in force
 * just before its start, in force before the previous period began, and in force at any moment of the
 * previous period: a lower price (or more included calls) holds from the first period that starts
 * after the change, a rise only from the first period whose previous period began after it, so the
 * subscriber, told when it was made (plan.changed, price-change.ts), has a whole period at the old
 * terms in which to leave. A drop taken back within one period still holds for the next: its notice
 * said so, and the rise that took it back was announced from the period after.
 */
export async function ensurePeriods(sql: Db, at: Date, subscriptions: string | string[] | null = null): Promise<number> {
  const ids = typeof subscriptions === 'string' ? [subscriptions] : subscriptions
  const [row] = await sql<{ created: number }[]>`
    with created as (
      insert into subscription_periods (
        subscription_id, period_index, period_start, period_end,
        monthly_price_cents, included_proxy_calls, overage_per_call_cents
      )
      select s.id, k, p.start, s.started_at + make_interval(months => k + 1),
        case when k = 0 then t.monthly_price_cents else best.monthly_price_cents end,
        case when k = 0 then t.included_proxy_calls else best.included_proxy_calls end,
        case when k = 0 then t.overage_per_call_cents else best.overage_per_call_cents end
      from subscriptions s
      cross join lateral (
        select coalesce(max(period_index), -1) + 1 as next from subscription_periods where subscription_id = s.id
      ) last
      cross join lateral (select least(${at}::timestamptz, coalesce(s.cancelled_at, ${at}::timestamptz)) as until) bound
      -- at most one period per 27 days have begun: an upper bound, trimmed by the where clause
      cross join lateral generate_series(
        last.next, last.next + greatest(0, floor(extract(epoch from bound.until - s.started_at) / 2332800))::int
      ) k
      cross join lateral (
        select s.started_at + make_interval(months => k) as start,
          s.started_at + make_interval(months => greatest(k - 1, 0)) as previous_start
      ) p
      -- in force at the period's start (the plan's first terms if none was yet)
      cross join lateral (
        select pt.* from plan_terms pt
        where pt.plan_id = s.plan_id
        order by (pt.effective_from <= p.start) desc,
          case when pt.effective_from <= p.start then pt.effective_from end desc nulls last,
          pt.effective_from
        limit 1
      ) t
      -- in force before the previous period began: what a subscriber was told a whole period ahead
      cross join lateral (
        select pt.* from plan_terms pt
        where pt.plan_id = s.plan_id
        order by (pt.effective_from < p.previous_start) desc,
          case when pt.effective_from < p.previous_start then pt.effective_from end desc nulls last,
          pt.effective_from
        limit 1
      ) told
      -- the best of those and of every version made since the previous period began, before this one
      -- did (a drop taken back within it was announced for this period, its taking back for the one
      -- after); a change made at the very instant this period began falls in it, as plan.changed says,
      -- and reaches the next. The version in force at the start is one of these.
      cross join lateral (
        select min(pt.monthly_price_cents) as monthly_price_cents, max(pt.included_proxy_calls) as included_proxy_calls,
          min(pt.overage_per_call_cents) as overage_per_call_cents
        from plan_terms pt
        where pt.plan_id = s.plan_id
          and (pt.effective_from = told.effective_from or (pt.effective_from >= p.previous_start and pt.effective_from < p.start))
      ) best
      where (${ids}::uuid[] is null or s.id = any(${ids}::uuid[]))
        and (k = 0 or p.start <= bound.until)
      -- A subscription being cancelled (by its subscriber, or its agent's deactivation: the only
      -- writers of its row) is passed over, its row read before the cancellation committed: a period
      -- made from it could begin after the cancellation. Its periods are made once that is settled
      -- (the next run, read or call). Share locks: readers of periods do not wait for each other.
      for share of s skip locked
      on conflict do nothing
      returning 1
    )
    select count(*)::int as created from created
  `
  return row!.created
}

/**
 * ensurePeriods for these subscriptions, waiting out the invoice run making the same periods: the run
 * makes every subscription's in one statement (2.4 to 3.3 s at 505,000 subscriptions, bench/notes.md),
 * and holds each period it made until that statement commits, longer than a request's lock timeout
 * (DATABASE_LOCK_TIMEOUT_MS, 2 s). This wait is bounded by the statement timeout instead, as a
 * purchase's for invoice_counter is (issuePurchaseInvoice). The setting goes with the statement,
 * pipelined (`execute`: sent before it).
 */
export async function ensurePeriodsPastRun(sql: Sql, at: Date, subscriptions: string | string[]): Promise<void> {
  await sql.begin(tx => Promise.all([tx`set local lock_timeout = 0`.execute(), ensurePeriods(tx, at, subscriptions)]))
}

export async function findSubscription(sql: Db, id: string, userId: string, now: Date): Promise<SubscriptionRow | undefined> {
  await ensurePeriods(sql, now, id)
  const [row] = await sql<SubscriptionRow[]>`
    select * from (${view(sql)}) v where v.id = ${id} and v.user_id = ${userId}
  `
  return row
}

export async function listSubscriptions(
  sql: Sql,
  userId: string,
  page: { limit: number; before: Date | undefined },
  now: Date,
): Promise<SubscriptionRow[]> {
  const ids = await sql<{ id: string }[]>`
    select id from subscriptions
    where user_id = ${userId} and (${page.before ?? null}::timestamptz is null or created_at < ${page.before ?? null})
    order by created_at desc, id desc
    limit ${page.limit}
  `
  const listed = ids.map(row => row.id)
  // Their new periods may be the invoice run's to make just now: waited for, not a 503 (ensurePeriodsPastRun).
  if (listed.length > 0) await ensurePeriodsPastRun(sql, now, listed)
  return sql<SubscriptionRow[]>`
    select * from (${view(sql)}) v
    where v.id = any(${listed}::uuid[])
    order by v."createdAt" desc, v.id desc
  `
}

/**
 * Cancels the user's subscription: 'cancelled', 'already' or 'missing'. Locks the agent's row before
 * the subscription's, the order subscribing and deactivating take them in, so none of them deadlock.
 */
export async function cancelSubscription(
  sql: Db,
  id: string,
  userId: string,
  at: Date,
): Promise<{ result: 'cancelled'; participantId: string } | { result: 'already' | 'missing' }> {
  const [agent] = await sql<{ participantId: string }[]>`
    select participant_id as "participantId" from subscriptions where id = ${id} and user_id = ${userId}
  `
  if (!agent) return { result: 'missing' }
  await sql`select 1 from participants where id = ${agent.participantId} for no key update`
  const [row] = await sql<{ status: string; participantId: string }[]>`
    select status, participant_id as "participantId" from subscriptions
    where id = ${id} and user_id = ${userId}
    for update
  `
  if (!row) return { result: 'missing' }
  if (row.status === 'cancelled') return { result: 'already' }
  await sql`update subscriptions set status = 'cancelled', cancelled_at = ${cancelledAt(sql, at)} where id = ${id}`
  return { result: 'cancelled', participantId: row.participantId }
}

/**
 * When a cancellation dated `at` takes effect, for the subscription whose row is being updated: no
 * earlier than the start of its latest period. That period was made while the subscription was
 * still active (ensurePeriods passes over one being cancelled), by a statement that read it so at or
 * after the period's start, though the cancellation was dated before: the cancellation falls in it,
 * the period it is invoiced for, rather than a whole period beginning after it.
 */
export function cancelledAt(sql: Db, at: Date) {
  return sql`greatest(${at}::timestamptz, (
    select max(sp.period_start) from subscription_periods sp where sp.subscription_id = subscriptions.id
  ))`
}

export async function adjustActiveSubscribers(sql: Db, participantId: string, delta: 1 | -1): Promise<void> {
  await sql`
    update participants set active_subscribers = active_subscribers + ${delta} where id = ${participantId}
  `
}

/** Whether the user has or had a subscription to the agent. */
export async function hasSubscribed(sql: Db, userId: string, participantId: string): Promise<boolean> {
  const [row] = await sql`
    select 1 from subscriptions where user_id = ${userId} and participant_id = ${participantId} limit 1
  `
  return row !== undefined
}

/** Whether the user holds an active subscription to the agent. */
export async function hasActiveSubscription(sql: Db, userId: string, participantId: string): Promise<boolean> {
  return (await activeSubscription(sql, userId, participantId)) !== undefined
}

/** The user's active subscription to the agent, if any. */
export async function activeSubscription(sql: Db, userId: string, participantId: string): Promise<{ id: string; startedAt: Date } | undefined> {
  const [row] = await sql<{ id: string; startedAt: Date }[]>`
    select id, started_at as "startedAt" from subscriptions
    where user_id = ${userId} and participant_id = ${participantId} and status = 'active'
  `
  return row
}

/**
 * The period a call at `periodIndex` counts in: that one, or the last before it when there is none
 * (the subscription was cancelled in an earlier period, between the call's check and the call).
 */
export async function periodUsage(
  sql: Db,
  subscriptionId: string,
  periodIndex: number,
): Promise<{ periodIndex: number; proxyCalls: number; includedProxyCalls: number; periodEnd: Date } | undefined> {
  const [row] = await sql<{ periodIndex: number; proxyCalls: number; includedProxyCalls: number; periodEnd: Date }[]>`
    select period_index as "periodIndex", proxy_calls as "proxyCalls", included_proxy_calls as "includedProxyCalls", period_end as "periodEnd"
    from subscription_periods
    where subscription_id = ${subscriptionId} and period_index <= ${periodIndex}
    order by period_index desc
    limit 1
  `
  return row
}
