/** SQL for subscriptions and their periods. */
import type { Db } from '../../db.ts'

export interface SubscriptionRow {
  id: string
  planId: string
  participantId: string
  participantName: string
  planName: string
  status: 'active' | 'cancelled'
  currentPeriodStart: Date
  currentPeriodEnd: Date
  proxyCalls: number
  includedProxyCalls: number
  createdAt: Date
  cancelledAt: Date | null
}

const view = (sql: Db) => sql`
  select
    s.id, s.plan_id as "planId", s.participant_id as "participantId", a.name as "participantName",
    p.name as "planName", s.status, s.current_period_start as "currentPeriodStart",
    s.current_period_end as "currentPeriodEnd", sp.proxy_calls as "proxyCalls",
    sp.included_proxy_calls as "includedProxyCalls", s.created_at as "createdAt",
    s.cancelled_at as "cancelledAt", s.user_id
  from subscriptions s
  join plans p on p.id = s.plan_id
  join participants a on a.id = s.participant_id
  join subscription_periods sp on sp.subscription_id = s.id and sp.period_index = s.current_period_index
`

export interface NewSubscription {
  userId: string
  participantId: string
  planId: string
  startedAt: Date
  periodEnd: Date
  terms: { monthlyPriceCents: number; includedProxyCalls: number; overagePerCallCents: number }
}

/** Inserts an active subscription and its first period; the unique index refuses a second active one. */
export async function insertSubscription(sql: Db, s: NewSubscription): Promise<string> {
  const [row] = await sql<{ id: string }[]>`
    insert into subscriptions (
      user_id, participant_id, plan_id, status, started_at, current_period_start, current_period_end, created_at
    ) values (
      ${s.userId}, ${s.participantId}, ${s.planId}, 'active', ${s.startedAt}, ${s.startedAt}, ${s.periodEnd}, ${s.startedAt}
    )
    returning id
  `
  await sql`
    insert into subscription_periods (
      subscription_id, period_index, period_start, period_end,
      monthly_price_cents, included_proxy_calls, overage_per_call_cents
    ) values (
      ${row!.id}, 0, ${s.startedAt}, ${s.periodEnd},
      ${s.terms.monthlyPriceCents}, ${s.terms.includedProxyCalls}, ${s.terms.overagePerCallCents}
    )
  `
  return row!.id
}

export async function findSubscription(sql: Db, id: string, userId: string): Promise<SubscriptionRow | undefined> {
  const [row] = await sql<SubscriptionRow[]>`
    select * from (${view(sql)}) v where v.id = ${id} and v.user_id = ${userId}
  `
  return row
}

export async function listSubscriptions(
  sql: Db,
  userId: string,
  page: { limit: number; before: Date | undefined },
): Promise<SubscriptionRow[]> {
  return sql<SubscriptionRow[]>`
    select * from (${view(sql)}) v
    where v.user_id = ${userId} and (${page.before ?? null}::timestamptz is null or v."createdAt" < ${page.before ?? null})
    order by v."createdAt" desc, v.id desc
    limit ${page.limit}
  `
}

/** Cancels the user's subscription: 'cancelled', 'already' or 'missing'. */
export async function cancelSubscription(
  sql: Db,
  id: string,
  userId: string,
  at: Date,
): Promise<{ result: 'cancelled'; participantId: string } | { result: 'already' | 'missing' }> {
  const [row] = await sql<{ status: string; participantId: string }[]>`
    select status, participant_id as "participantId" from subscriptions
    where id = ${id} and user_id = ${userId}
    for update
  `
  if (!row) return { result: 'missing' }
  if (row.status === 'cancelled') return { result: 'already' }
  await sql`update subscriptions set status = 'cancelled', cancelled_at = ${at} where id = ${id}`
  return { result: 'cancelled', participantId: row.participantId }
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
  const [row] = await sql`
    select 1 from subscriptions where user_id = ${userId} and participant_id = ${participantId} and status = 'active'
  `
  return row !== undefined
}
