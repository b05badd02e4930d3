/** Wire schema of creator stats. */
import { t } from 'elysia'
import { Int, Uuid } from '../../http/schema.ts'

export const AgentStats = t.Object({
  participantId: Uuid,
  name: t.String(),
  activeSubscribers: Int(),
  revenueCents: Int({ description: 'Everything earned, all time' }),
  revenueThisMonthCents: Int({ description: 'Earned in the current calendar month (UTC)' }),
  configSales: Int(),
  configRevenueCents: Int(),
  proxyCallsThisMonth: Int(),
  rating: t.Object({ average: t.Union([t.Number(), t.Null()]), count: Int() }),
})

export const CreatorStats = t.Object({
  totals: t.Object({ revenueCents: Int(), activeSubscribers: Int(), configSales: Int() }),
  agents: t.Array(AgentStats),
})
export type CreatorStats = typeof CreatorStats.static
