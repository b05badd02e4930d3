/**
 * Serving /metrics, never publicly: on the API's port only with METRICS_TOKEN (as a bearer token),
 * and on a port of its own with METRICS_PORT (the token too, when one is set), which a process
 * running only workers serves as well. While the scraper's token is rotated, METRICS_TOKEN_PREVIOUS
 * is taken beside it.
 */
import { createHash, timingSafeEqual } from 'node:crypto'
import { Elysia } from 'elysia'
import { errors } from '../errors.ts'
import { renderError } from '../http/error-handler.ts'
import { bearerTokenOf } from '../http/formats.ts'
import type { Metrics } from './metrics.ts'

/** The tokens GET /metrics takes (none: no token asked for). */
export function metricsTokens(config: { token: string | undefined; tokenPrevious: string | undefined }): string[] {
  return [config.token, config.tokenPrevious].filter((token): token is string => token !== undefined)
}

/**
 * Whether the request carries `Authorization: Bearer <token>` for one of the tokens, each compared in
 * constant time. The scheme is read in any case, and the spaces around the token in any number, as
 * the API's routes read it (RFC 9110: `bearer` is Bearer).
 */
function authorized(request: Request, tokens: string[]): boolean {
  const digest = (text: string) => createHash('sha256').update(text).digest()
  const given = bearerTokenOf(request.headers.get('authorization') ?? '')
  if (given === undefined) return false
  const header = digest(given)
  return tokens.map(token => timingSafeEqual(header, digest(token))).includes(true)
}

async function answer(request: Request, metrics: Metrics, tokens: string[]): Promise<Response> {
  if (tokens.length > 0) {
    if (!request.headers.has('authorization')) return renderError(errors.unauthorized())
    if (!authorized(request, tokens)) return renderError(errors.invalidToken())
  }
  const { body, contentType } = await metrics.text()
  return new Response(body, { headers: { 'content-type': contentType, 'cache-control': 'no-store' } })
}

/** GET /metrics on the API's port, when a token guards it; left out of the OpenAPI document. */
export function metricsRoutes(metrics: Metrics, tokens: string[]) {
  const routes = new Elysia({ name: 'metrics-routes' })
  if (tokens.length === 0) return routes
  return routes.get('/metrics', ({ request }) => answer(request, metrics, tokens), { detail: { hide: true } })
}

/**
 * GET /metrics on a port of its own.
 *
 * @example
 * const server = serveMetrics(metrics, { port: 9464, tokens: [] })
 * await server.stop()
 */
export function serveMetrics(metrics: Metrics, options: { port: number; tokens: string[] }) {
  return Bun.serve({
    port: options.port,
    fetch(request) {
      if (new URL(request.url).pathname !== '/metrics') return renderError(errors.notFound('Route'))
      if (request.method !== 'GET' && request.method !== 'HEAD') return renderError(errors.methodNotAllowed(request.method, ['GET', 'HEAD']))
      return answer(request, metrics, options.tokens)
    },
  })
}
