/** Wire schema of creator stats. */
import { t } from 'elysia'
import { Int, Uuid } from '../../http/schema.ts'

export const AgentStats = t.Object(
  {
    participantId: Uuid,
    name: t.String(),
    activeSubscribers: Int(),
    revenueCents: Int({ description: 'Everything earned, all time' }),
    revenueThisMonthCents: Int({ description: 'Earned in the current calendar month (UTC)' }),
    configSales: Int(),
    configRevenueCents: Int(),
    proxyCallsThisMonth: Int(),
    rating: t.Object({ average: t.Union([t.Number(), t.Null()]), count: Int() }),
  },
  { $id: 'AgentStats', description: 'One of the caller’s agents: subscribers, revenue, sales, usage, rating' },
)

export const CreatorStats = t.Object(
  {
    totals: t.Object({ revenueCents: Int(), activeSubscribers: Int(), configSales: Int() }),
    agents: t.Array(AgentStats),
  },
  { $id: 'CreatorStats', description: 'Revenue and subscribers of the caller’s agents, in total and each' },
)
export type CreatorStats = typeof CreatorStats.static
