/**
 * Serving /metrics, never publicly: on the API's port only with METRICS_TOKEN (as a bearer token),
 * and on a port of its own with METRICS_PORT (the token too, when one is set), which a process
 * running only workers serves as well.
 */
import { createHash, timingSafeEqual } from 'node:crypto'
import { Elysia } from 'elysia'
import { errors } from '../errors.ts'
import { renderError } from '../http/error-handler.ts'
import type { Metrics } from './metrics.ts'

/** Whether the request carries `Authorization: Bearer <token>`, compared in constant time. */
function authorized(request: Request, token: string | undefined): boolean {
  if (token === undefined) return true
  const header = request.headers.get('authorization') ?? ''
  const digest = (text: string) => createHash('sha256').update(text).digest()
  return timingSafeEqual(digest(header), digest(`Bearer ${token}`))
}

async function answer(request: Request, metrics: Metrics, token: string | undefined): Promise<Response> {
  if (!request.headers.has('authorization') && token !== undefined) return renderError(errors.unauthorized())
  if (!authorized(request, token)) return renderError(errors.invalidToken())
  const { body, contentType } = await metrics.text()
  return new Response(body, { headers: { 'content-type': contentType, 'cache-control': 'no-store' } })
}

/** GET /metrics on the API's port, when a token guards it; left out of the OpenAPI document. */
export function metricsRoutes(metrics: Metrics, token: string | undefined) {
  const routes = new Elysia({ name: 'metrics-routes' })
  if (token === undefined) return routes
  return routes.get('/metrics', ({ request }) => answer(request, metrics, token), { detail: { hide: true } })
}

/**
 * GET /metrics on a port of its own.
 *
 * @example
 * const server = serveMetrics(metrics, { port: 9464 })
 * await server.stop()
 */
export function serveMetrics(metrics: Metrics, options: { port: number; token?: string }) {
  return Bun.serve({
    port: options.port,
    fetch(request) {
      if (new URL(request.url).pathname !== '/metrics') return renderError(errors.notFound('Route'))
      if (request.method !== 'GET' && request.method !== 'HEAD') return renderError(errors.methodNotAllowed(request.method, ['GET', 'HEAD']))
      return answer(request, metrics, options.token)
    },
  })
}
