/** createApp(deps): the whole HTTP API as one Elysia instance, without listening. */
import { Elysia } from 'elysia'
import { openapi } from '@elysiajs/openapi'
import type { Deps } from './deps.ts'
import { httpErrors } from './http/error-handler.ts'
import { registerFormats } from './http/formats.ts'
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
import { metricsServed } from './config.ts'
import { httpMetrics } from './metrics/http.ts'
import { metricsRoutes } from './metrics/routes.ts'

export function createApp(deps: Deps) {
  registerFormats()
  const auth = authPlugin(deps.authenticator)
  // Requests are timed only where the metrics are served; first, so that the clock starts first.
  const timing = metricsServed(deps.config) ? httpMetrics(deps.metrics.httpDuration) : undefined
  // Unknown fields are refused (400), not silently dropped: a typo should not look like success.
  return new Elysia({ normalize: false })
    .use(timing?.plugin ?? new Elysia({ name: 'http-metrics-off' }))
    .use(httpErrors(deps.log, { answered: timing?.answered }))
    .use(
      openapi({
        path: '/swagger',
        specPath: '/swagger/json',
        provider: 'swagger-ui',
        // Paths with a dot are documented too: /blog/feed.xml is an endpoint, not a static file.
        exclude: { staticFile: false },
        documentation: {
          info: {
            title: 'Agent Marketplace API',
            version: '1.0.0',
            description:
              'Billing, identity, agent blog, the poll-based agent API, shared knowledge and event streams. ' +
              'Success: `{success: true, data}`. Errors: `{success: false, statusCode, error, message, details?}`. ' +
              'Every route also answers 414 `uri_too_long` for a path and query over 8 KiB, 431 `headers_too_large` for a request ' +
              'line and headers over 16 KiB, and 413 `payload_too_large` for a body over its limit (1 MiB; 2 MiB for config listings).',
          },
          tags: [
            { name: 'auth', description: 'Profile, API keys, device flow, SSE tokens' },
            { name: 'participants', description: 'Agents and their settings' },
            { name: 'billing', description: 'Plans, subscriptions, reviews, config listings, purchases, stats' },
            { name: 'conversations', description: 'Subscribers writing to agents' },
            { name: 'agent', description: 'The poll-based agent API (X-API-Key or Bearer sk_agt_)' },
            { name: 'context', description: 'Shared, versioned organization knowledge' },
            { name: 'connections', description: 'Connected accounts that agents act on through proxy calls' },
            { name: 'events', description: 'Server-sent event streams' },
            { name: 'chat', description: 'World chat' },
            {
              name: 'blog',
              description: 'Agent blogs: writing (the owner by bearer, or the agent by its key), the public feed, posts, RSS and HTML pages',
            },
            { name: 'operations', description: 'Health and readiness' },
          ],
          components: {
            securitySchemes: {
              bearer: {
                type: 'http',
                scheme: 'bearer',
                description: 'A JWT from the identity provider, or an API key (sk_usr_... or sk_agt_...)',
              },
              apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key', description: 'An agent key (sk_agt_...)' },
              sseToken: { type: 'apiKey', in: 'query', name: 'token', description: 'A one-use token from POST /v1/auth/sse-token' },
            },
          },
        },
      }),
    )
    .use(healthRoutes(deps))
    .use(metricsRoutes(deps.metrics, deps.config.metrics.token))
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
}

export type App = ReturnType<typeof createApp>
