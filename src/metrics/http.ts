/**
 * Times every HTTP request into http_request_duration_seconds, labelled with the route's template
 * (not its URL), the method and the status. A request's cost is a clock read on arrival, one when
 * answered and three map lookups to a histogram child made once per label set; no label object is
 * made per request.
 */
import { Elysia } from 'elysia'
import type { Histogram } from 'prom-client'

type Child = ReturnType<Histogram<'route' | 'method' | 'status'>['labels']>

/** Requests that matched no route, or were refused before routing (413, 414, 431). */
const unmatchedRoute = 'unmatched'

const methods = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'])

// Where a request's arrival time is kept: on Elysia's per-request response state (`set`). Hooks take
// only the context's fields they use: Elysia reads which ones from their source, and one that is
// handed the whole context makes every route parse headers, cookies and the query.
const arrivedAt = Symbol('arrivedAt')

type Timed = { [arrivedAt]?: number }

/** Times one request by its response state, route template (undefined: none matched), method and status. */
export type Answered = (set: object, route: string | undefined, request: Request, status: number) => void

/**
 * `plugin` goes before any other, so that its clock starts first, and times what handlers answer;
 * `answered` times what the error handler answers (httpErrors), which comes to no handler's end.
 */
export function httpMetrics(histogram: Histogram<'route' | 'method' | 'status'>) {
  const children = new Map<string, Map<string, Map<number, Child>>>()

  const childOf = (route: string, method: string, status: number): Child => {
    let byMethod = children.get(route)
    if (!byMethod) children.set(route, (byMethod = new Map()))
    let byStatus = byMethod.get(method)
    if (!byStatus) byMethod.set(method, (byStatus = new Map()))
    let child = byStatus.get(status)
    if (!child) byStatus.set(status, (child = histogram.labels(route, method, String(status))))
    return child
  }

  const answered: Answered = (set, route, request, status) => {
    const started = (set as Timed)[arrivedAt]
    if (started === undefined) return
    // Once: a response that fails its schema after the handler comes to the error handler too.
    ;(set as Timed)[arrivedAt] = undefined
    const method = request.method
    childOf(route || unmatchedRoute, methods.has(method) ? method : 'OTHER', status).observe((performance.now() - started) / 1000)
  }

  const plugin = new Elysia({ name: 'http-metrics' })
    .onRequest(({ set }) => {
      ;(set as Timed)[arrivedAt] = performance.now()
    })
    // Inline, as the handler returns: an event stream is timed to its start, not to its end. (An
    // onAfterResponse hook would cost every request a setImmediate and an async function.)
    .onAfterHandle({ as: 'global' }, ({ set, route, request, response }) => {
      answered(set, route, request, response instanceof Response ? response.status : typeof set.status === 'number' ? set.status : 200)
    })

  return { plugin, answered }
}
