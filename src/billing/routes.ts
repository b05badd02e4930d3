/** /v1/billing: every marketplace billing route, one plugin per resource. */
import { Elysia } from 'elysia'
import type { DatabaseIdentity, Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { planRoutes } from './plans/routes.ts'
import { subscriptionRoutes } from './subscriptions/routes.ts'
import { reviewRoutes } from './reviews/routes.ts'
import { configRoutes } from './configs/routes.ts'
import { statsRoutes } from './stats/routes.ts'

/** What the billing routes use together; Redis, keys and database for subscriptions' live counts. */
export interface RouteDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  database: DatabaseIdentity
  clock: Clock
  rateLimiter: RateLimiter
}

export function billingRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/billing' })
    .use(planRoutes(deps, auth))
    .use(subscriptionRoutes(deps, auth))
    .use(reviewRoutes(deps, auth))
    .use(configRoutes(deps, auth))
    .use(statsRoutes(deps, auth))
}
