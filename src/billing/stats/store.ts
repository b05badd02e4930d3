/** SQL for creator stats: one set-based query over the owner's agents. */
import type { Db } from '../../db.ts'

export interface AgentStatsRow {
  participantId: string
  name: string
  activeSubscribers: number
  ratingSum: number
  ratingCount: number
  configSales: number
  configRevenueCents: number
  configRevenueThisMonthCents: number
  proxyCallsThisMonth: number
}

export async function agentStats(
  sql: Db,
  ownerId: string,
  month: { start: Date; end: Date },
): Promise<AgentStatsRow[]> {
  return sql<AgentStatsRow[]>`
    select
      a.id as "participantId", a.name, a.active_subscribers as "activeSubscribers",
      a.rating_sum as "ratingSum", a.rating_count as "ratingCount",
      coalesce(sales.count, 0)::int as "configSales",
      coalesce(sales.revenue, 0)::bigint as "configRevenueCents",
      coalesce(sales.revenue_this_month, 0)::bigint as "configRevenueThisMonthCents",
      coalesce(calls.count, 0)::bigint as "proxyCallsThisMonth"
    from participants a
    left join lateral (
      select
        count(*) as count,
        sum(cp.price_cents) as revenue,
        sum(cp.price_cents) filter (where cp.purchased_at >= ${month.start}) as revenue_this_month
      from config_purchases cp join config_listings c on c.id = cp.config_id
      where c.participant_id = a.id
    ) sales on true
    left join lateral (
      select sum(sp.proxy_calls) as count
      from subscriptions s join subscription_periods sp on sp.subscription_id = s.id
      where s.participant_id = a.id and sp.period_end > ${month.start} and sp.period_start < ${month.end}
    ) calls on true
    where a.owner_id = ${ownerId} and a.active
    order by a.created_at, a.id
  `
}
