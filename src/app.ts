/** createApp(deps): the whole HTTP API as one Elysia instance, without listening. */
import { Elysia } from 'elysia'
import type { Deps } from './deps.ts'
import { httpErrors } from './http/error-handler.ts'
import { registerFormats } from './http/formats.ts'
import { routeMethods } from './http/route-methods.ts'
import { crossOrigin } from './http/cors.ts'
import { authPlugin } from './auth/plugin.ts'
import { authRoutes } from './auth/routes.ts'
import { devicePage } from './auth/device-page.ts'
import { participantRoutes } from './participants/routes.ts'
import { healthRoutes } from './health/routes.ts'
import { billingRoutes } from './billing/routes.ts'
import { conversationRoutes } from './conversations/routes.ts'
import { agentApiRoutes } from './agent-api/routes.ts'
import { contextRoutes } from './context/routes.ts'
import { connectionRoutes } from './connections/routes.ts'
import { invoiceRoutes } from './invoices/routes.ts'
import { eventRoutes } from './events/routes.ts'
import { chatRoutes } from './chat/routes.ts'
import { blogRoutes } from './blog/routes.ts'
import { publicBlogRoutes } from './blog/public-routes.ts'
import { blogPages } from './blog/pages.ts'
import { openApiRoutes } from './openapi/routes.ts'
import { metricsServed } from './config.ts'
import { httpMetrics } from './metrics/http.ts'
import { metricsRoutes, metricsTokens } from './metrics/routes.ts'

export function createApp(deps: Deps) {
  registerFormats()
  const auth = authPlugin(deps.authenticator)
  const routes = routeMethods()
  // Requests are timed only where the metrics are served; first, so that the clock starts first.
  const timing = metricsServed(deps.config) ? httpMetrics(deps.metrics.httpDuration) : undefined
  // Unknown fields are refused (400), not silently dropped: a typo should not look like success.
  // `standardHostname: false`: Elysia otherwise looks for the path past the URL's 11th character,
  // assuming a host of 4 characters or more; behind `Host: api` (a proxy's upstream name) it read
  // /@name/blog as /blog, a path it does not have, and a wrong method's path as none (404, not 405).
  // It then looks past `http://`, the only scheme the service listens with (TLS ends at a proxy).
  const app = new Elysia({ normalize: false, handler: { standardHostname: false } })
    .use(timing?.plugin ?? new Elysia({ name: 'http-metrics-off' }))
    .use(httpErrors(deps.log, routes, deps.lifecycle, crossOrigin(deps.config.corsOrigins), timing?.answered))
    .use(healthRoutes(deps))
    .use(metricsRoutes(deps.metrics, metricsTokens(deps.config.metrics)))
    .use(authRoutes(deps, auth))
    .use(devicePage(deps))
    .use(participantRoutes(deps, auth))
    .use(billingRoutes(deps, auth))
    .use(conversationRoutes(deps, auth))
    .use(agentApiRoutes(deps, auth))
    .use(contextRoutes(deps, auth))
    .use(invoiceRoutes(deps, auth))
    .use(connectionRoutes(deps, auth))
    .use(eventRoutes(deps))
    .use(chatRoutes(deps, auth))
    .use(blogRoutes(deps, auth))
    .use(publicBlogRoutes(deps))
    .use(blogPages(deps))
  const documented = app.use(openApiRoutes(() => app, deps.config.siteUrl))
  routes.index(documented.routes)
  return documented
}

export type App = ReturnType<typeof createApp>
