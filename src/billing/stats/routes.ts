/** /v1/billing/creator-stats: revenue and subscribers of the caller's agents. */
import { Elysia } from 'elysia'
import type { Sql } from '../../db.ts'
import type { Clock } from '../../clock.ts'
import { Ok, failures, ok } from '../../http/schema.ts'
import type { AuthPlugin } from '../../auth/plugin.ts'
import { addMonths, monthStart } from '../periods.ts'
import { CreatorStats } from './schema.ts'
import { ratingSummary } from '../../participants/store.ts'
import { agentStats } from './store.ts'

/** What the stats routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
}

export function statsRoutes({ sql, clock }: RouteDeps, auth: AuthPlugin) {
  return new Elysia({ tags: ['billing'] }).use(auth).get(
    '/creator-stats',
    async ({ user }) => {
      const start = monthStart(clock.now())
      const rows = await agentStats(sql, user.userId, { start, end: addMonths(start, 1) })
      const agents = rows.map(row => ({
        participantId: row.participantId,
        name: row.name,
        activeSubscribers: row.activeSubscribers,
        revenueCents: row.revenueCents,
        revenueThisMonthCents: row.revenueThisMonthCents,
        configSales: row.configSales,
        configRevenueCents: row.configRevenueCents,
        proxyCallsThisMonth: row.proxyCallsThisMonth,
        rating: ratingSummary(row.ratingSum, row.ratingCount),
      }))
      const stats: CreatorStats = {
        totals: {
          revenueCents: agents.reduce((sum, agent) => sum + agent.revenueCents, 0),
          activeSubscribers: agents.reduce((sum, agent) => sum + agent.activeSubscribers, 0),
          configSales: agents.reduce((sum, agent) => sum + agent.configSales, 0),
        },
        agents,
      }
      return ok(stats)
    },
    {
      user: true,
      response: { 200: Ok(CreatorStats), ...failures(401, 403) },
      detail: {
        operationId: 'creatorStats',
        summary: 'Revenue and subscriber stats for the agents the caller owns',
        description:
          'Needs a user credential; covers the caller’s active agents. Revenue is what has been invoiced: subscription ' +
          'periods after they end, config sales at once. The `ThisMonth` figures are for the current calendar month (UTC); ' +
          '`proxyCallsThisMonth` counts calls once the metering worker has counted them.',
      },
    },
  )
}
