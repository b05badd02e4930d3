/** /v1/billing: every marketplace billing route, one plugin per resource. */
import { Elysia } from 'elysia'
import type { Deps } from '../deps.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { planRoutes } from './plans/routes.ts'
import { subscriptionRoutes } from './subscriptions/routes.ts'
import { reviewRoutes } from './reviews/routes.ts'
import { configRoutes } from './configs/routes.ts'
import { statsRoutes } from './stats/routes.ts'

export function billingRoutes(deps: Deps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/billing' })
    .use(planRoutes(deps, auth))
    .use(subscriptionRoutes(deps, auth))
    .use(reviewRoutes(deps, auth))
    .use(configRoutes(deps, auth))
    .use(statsRoutes(deps, auth))
}
