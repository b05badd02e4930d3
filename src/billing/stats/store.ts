/** SQL for creator stats: one set-based query over the owner's agents. */
import type { Db } from '../../db.ts'

export interface AgentStatsRow {
  participantId: string
  name: string
  activeSubscribers: number
  ratingSum: number
  ratingCount: number
  revenueCents: number
  revenueThisMonthCents: number
  configSales: number
  configRevenueCents: number
  proxyCallsThisMonth: number
}

/**
 * Revenue is what was invoiced; calls are usage events counted in the calendar month, over every
 * subscription of each agent (`subscriptions_by_agent`), cancelled ones too. The statement unsent
 * until awaited, so a test can also explain it.
 */
export function agentStats(sql: Db, ownerId: string, month: { start: Date; end: Date }) {
  return sql<AgentStatsRow[]>`
    select
      a.id as "participantId", a.name, a.active_subscribers as "activeSubscribers",
      a.rating_sum as "ratingSum", a.rating_count as "ratingCount",
      coalesce(revenue.total, 0)::bigint as "revenueCents",
      coalesce(revenue.this_month, 0)::bigint as "revenueThisMonthCents",
      coalesce(revenue.sales, 0)::int as "configSales",
      coalesce(revenue.config_total, 0)::bigint as "configRevenueCents",
      coalesce(calls.count, 0)::bigint as "proxyCallsThisMonth"
    from participants a
    left join lateral (
      select
        sum(i.total_cents) as total,
        sum(i.total_cents) filter (where i.issued_at >= ${month.start} and i.issued_at < ${month.end}) as this_month,
        count(*) filter (where i.purchase_id is not null) as sales,
        sum(i.total_cents) filter (where i.purchase_id is not null) as config_total
      from invoices i
      where i.participant_id = a.id
    ) revenue on true
    left join lateral (
      select count(*) as count
      from subscriptions s join usage_events e on e.subscription_id = s.id
      where s.participant_id = a.id and e.occurred_at >= ${month.start} and e.occurred_at < ${month.end}
    ) calls on true
    where a.owner_id = ${ownerId} and a.active
    order by a.created_at, a.id
  `
}
