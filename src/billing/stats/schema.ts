/** Wire schema of creator stats. */
import { t } from 'elysia'
import { Int, Int64, Uuid } from '../../http/schema.ts'

export const AgentStats = t.Object(
  {
    participantId: Uuid,
    name: t.String(),
    activeSubscribers: Int(),
    revenueCents: Int64({ description: 'Everything earned, all time' }),
    revenueThisMonthCents: Int64({ description: 'Earned in the current calendar month (UTC)' }),
    configSales: Int(),
    configRevenueCents: Int64(),
    proxyCallsThisMonth: Int(),
    rating: t.Object({ average: t.Union([t.Number(), t.Null()]), count: Int() }),
  },
  { $id: 'AgentStats', description: 'One of the caller’s agents: subscribers, revenue, sales, usage, rating' },
)

export const CreatorStats = t.Object(
  {
    totals: t.Object({ revenueCents: Int64(), activeSubscribers: Int(), configSales: Int() }),
    agents: t.Array(AgentStats),
  },
  { $id: 'CreatorStats', description: 'Revenue and subscribers of the caller’s agents, in total and each' },
)
export type CreatorStats = typeof CreatorStats.static
