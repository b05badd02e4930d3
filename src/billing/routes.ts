/** /v1/billing: every marketplace billing route, one plugin per resource. */
import { Elysia } from 'elysia'
import type { AuthPlugin } from '../auth/plugin.ts'
import { planRoutes, type RouteDeps as PlanDeps } from './plans/routes.ts'
import { subscriptionRoutes, type RouteDeps as SubscriptionDeps } from './subscriptions/routes.ts'
import { reviewRoutes, type RouteDeps as ReviewDeps } from './reviews/routes.ts'
import { configRoutes, type RouteDeps as ConfigDeps } from './configs/routes.ts'
import { statsRoutes, type RouteDeps as StatsDeps } from './stats/routes.ts'

/** What the billing routes use together: what each resource's routes use. */
export type RouteDeps = PlanDeps & SubscriptionDeps & ReviewDeps & ConfigDeps & StatsDeps

export function billingRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/billing' })
    .use(planRoutes(deps, auth))
    .use(subscriptionRoutes(deps, auth))
    .use(reviewRoutes(deps, auth))
    .use(configRoutes(deps, auth))
    .use(statsRoutes(deps, auth))
}
