/** Renders every failure, ours and the framework's, as the contract's error envelope. */
import { randomUUID } from 'node:crypto'
import { Elysia, ValidationError } from 'elysia'
import { AppError, errors, type ErrorDetail } from '../errors.ts'
import { errorFields, throttled, type Log, type Throttled } from '../log.ts'
import { isBadInput, isDatabaseUnavailable, isTransientFailure } from '../db.ts'
import { isRedisUnavailable } from '../redis.ts'
import { isStorableText } from '../text.ts'
import { headTooLarge } from './request-limits.ts'
import { noStore } from './caching.ts'
import { targetProblem } from './request-target.ts'
import type { RouteMethods } from './route-methods.ts'
import type { CrossOrigin } from './cors.ts'

/** Told of every request the error handler answers: the request's metrics (metrics/http.ts's `answered`). */
type Answered = (set: object, route: string | undefined, request: Request, status: number) => void

export function renderError(error: AppError): Response {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...error.headers }
  if (error.status === 401) {
    headers['www-authenticate'] = error.code === 'invalid_token' ? 'Bearer realm="api", error="invalid_token"' : 'Bearer realm="api"'
  }
  const body = {
    success: false,
    statusCode: error.status,
    error: error.code,
    message: error.message,
    ...(error.details ? { details: error.details } : {}),
  }
  return new Response(JSON.stringify(body), { status: error.status, headers })
}

/**
 * Maps anything thrown to the AppError a client should see; logs what is our fault, and backing
 * services being unreachable through `outage` (every request fails alike then: see httpErrors).
 * Records name the route's template, never the path: a path can hold a credential (a device code,
 * which its poll exchanges for an API key), and a log is read by more people than the API's clients.
 */
export function toAppError(
  code: unknown,
  error: unknown,
  log: Log,
  request: { method: string; path: string; route: string | undefined; routes: RouteMethods; headers: Headers },
  outage: Throttled,
): AppError {
  // A 500 of the catalogue (a refusal no error maps) is a bug as any other is: logged, with its reference.
  if (error instanceof AppError && error.status !== 500) return error
  const { path } = request
  const route = request.route || 'unmatched'
  // A 500's reference, in its answer and its log record: the one a proxy in front sent, or a new one.
  const requestId = () => requestIdOf(request.headers) ?? randomUUID()
  if (error instanceof ValidationError) {
    if (error.type === 'response') {
      // Where it failed and why, never the error itself: Elysia's message (and the stack that
      // repeats it) holds the whole response, which may carry a secret (a new agent's API key) and
      // be megabytes (a listing).
      const id = requestId()
      log.error('response failed its own schema', { route, requestId: id, issues: validationDetails(error) })
      return errors.internal(id)
    }
    return errors.validation(`The ${parts[error.type] ?? 'request'} ${error.type === 'body' ? 'is' : 'are'} not valid`, validationDetails(error))
  }
  switch (code) {
    case 'NOT_FOUND': {
      // A path the service has, asked with a method it does not take: 405, saying which it takes.
      const allowed = request.routes.allowed(path)
      return allowed ? errors.methodNotAllowed(request.method, allowed) : errors.notFound('Route')
    }
    case 'PARSE':
      return errors.invalidJson()
    case 'INVALID_FILE_TYPE':
    case 'INVALID_COOKIE_SIGNATURE':
      return errors.validation('The request is not valid')
  }
  // Input the schemas let through but Postgres cannot store (a NUL character, an overlong value):
  // the client's to fix, and nothing was written.
  if (isBadInput(error)) {
    return errors.validation('The request holds a value that cannot be stored (e.g. a NUL character)')
  }
  // Postgres gave up a statement (a statement timeout, a lock wait, a deadlock) and changed nothing.
  // A timeout is an error (it may be a query that needs an index); deadlocks and serialization
  // failures come with contention, a warning.
  if (isTransientFailure(error)) {
    const pgCode = (error as { code?: string }).code
    const fields = { route, ...errorFields(error) }
    if (pgCode === '57014') outage('error', 'postgres-timeout', 'database statement cancelled (statement timeout)', fields)
    // Misconfiguration, not contention: a pooler without prepared statements (docs/operations.md).
    else if (pgCode === 'COMMIT_ROLLED_BACK') outage('error', 'postgres-commit', 'transaction rolled back at COMMIT', fields)
    else outage('warn', 'postgres-gave-up', 'database statement given up (lock or deadlock)', fields)
    return errors.unavailable('The database is busy; try again', 1)
  }
  if (isDatabaseUnavailable(error) || isRedisUnavailable(error)) {
    outage('error', errorFields(error).error as string, 'backing service unavailable', { route, ...errorFields(error) })
    return errors.unavailable()
  }
  const id = requestId()
  log.error('unhandled error', { route, requestId: id, ...errorFields(error) })
  return errors.internal(id)
}

/** A request's `X-Request-Id` (as nginx's `$request_id` or a load balancer sends it) when it is one to log: 1 to 128 letters, digits and `._:=+/-`. */
export function requestIdOf(headers: Headers): string | null {
  const id = headers.get('x-request-id')
  return id !== null && /^[\w.:=+/-]{1,128}$/.test(id) ? id : null
}

const parts: Record<string, string> = {
  body: 'request body',
  params: 'path parameters',
  query: 'query parameters',
  headers: 'headers',
  cookie: 'cookies',
}

function validationDetails(error: ValidationError): ErrorDetail[] {
  const seen = new Set<string>()
  const details: ErrorDetail[] = []
  for (const issue of error.all.flatMap(narrowed)) {
    const path = 'path' in issue && typeof issue.path === 'string' ? issue.path : ''
    // A schema's own `error` (Elysia's option) says the rule in the contract's words.
    const own = 'schema' in issue && (issue.schema as { error?: unknown } | undefined)?.error
    const message = typeof own === 'string' ? own : 'message' in issue && typeof issue.message === 'string' ? issue.message : 'is not valid'
    const line = `${path}\u0000${message}`
    if (seen.has(line)) continue
    seen.add(line)
    details.push({ path: path || '/', message })
    if (details.length === 20) break
  }
  return details
}

/**
 * A union's failure (a nullable field's, mostly) says only `Expected union value`. When exactly one
 * variant is of the value's own JSON type and refused it at the same place, by a constraint of its
 * own (a string's pattern or length, a number's range), that variant's message says why instead.
 * When exactly one variant is of the value's type and refused it deeper inside (an object, in a body
 * that may be left out: object, null or nothing), that variant's problems say where instead. A
 * value of no variant's type, or of several (a choice of literals), keeps the union's message.
 */
function narrowed<Issue extends object>(issue: Issue): Issue[] {
  if (!('errors' in issue) || !Array.isArray(issue.errors)) return [issue]
  const path = 'path' in issue ? issue.path : undefined
  // TypeBox ValueErrors: what the reader above takes from an issue (path, message) they have too.
  const variants = issue.errors as ({ First?: () => unknown } & Iterable<Issue>)[]
  const firsts = variants.map(variant => variant?.First?.() as (Issue & { path?: unknown; value?: unknown; schema?: { type?: unknown } }) | undefined)
  const own = firsts.filter(first => first && first.path === path && first.schema?.type === jsonType(first.value))
  if (own.length === 1) return narrowed(own[0]!)
  const value = 'value' in issue ? issue.value : undefined
  const types = ('schema' in issue && (issue.schema as { anyOf?: { type?: unknown }[] } | undefined)?.anyOf) || []
  const ofType = types.flatMap((variant, i) => (variant?.type === jsonType(value) && firsts[i] ? [i] : []))
  if (ofType.length !== 1) return [issue]
  // `First` took the variant's first problem from its iterator: the rest follow it there.
  const [i] = ofType as [number]
  return [firsts[i]!, ...variants[i]!].flatMap(narrowed)
}

function jsonType(value: unknown): string {
  if (value === null) return 'null'
  if (Array.isArray(value)) return 'array'
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number'
  return typeof value
}

/**
 * The global error handler, the body size limit and the body's media type, as one plugin. Bodies are
 * capped per route family (config listings carry files, so they get more), and are JSON: no route
 * takes another media type. JSON is parsed by Elysia's own parser, so the OpenAPI document keeps
 * every request schema; its parse failures render as `invalid_json`. `routes` knows which methods
 * each path takes (indexed once every route is registered): OPTIONS is answered from it, and a
 * wrong method is 405. `lifecycle` says when the process drains: its answers then close their
 * connections. `cors` (CORS_ORIGINS; null: none) adds its headers to every answer, errors and streams
 * included, and answers preflights here, before any route, credential, Postgres or Redis: a preflight
 * costs what a 404 does. `answered` is told of every request this plugin answers, refused at the door
 * or failed (the request's metrics). Its hooks take only the context's fields they use (see metrics/http.ts).
 */
export function httpErrors(log: Log, routes: RouteMethods, lifecycle: { readonly draining: boolean }, cors: CrossOrigin | null, answered?: Answered) {
  // While Postgres or Redis is down every request that needs it fails the same way: one record of
  // each failure every 10 s (with how many were held back) tells as much as one per request.
  const outage = throttled(log, 10_000)
  const failed = (code: string | number, error: unknown, path: string, route: string | undefined, request: Request) =>
    toAppError(code, error, log, { method: request.method, path, route, routes, headers: request.headers }, outage)
  // What every answer carries, set on the context so that each gets it (a route's, a stream's, an
  // error's): `Cache-Control: no-store`, unless the answer says otherwise (a public document:
  // caching.ts); while a shutdown waits for load balancers to notice (SHUTDOWN_DELAY_MS), a close of
  // its connection, so that a client's next request opens one elsewhere rather than racing the close;
  // and the CORS headers for the page that asked, if any.
  const atTheDoor = (request: Request, set: { headers: Record<string, unknown> }) => {
    set.headers['cache-control'] = noStore
    if (lifecycle.draining) set.headers.connection = 'close'
    if (cors) Object.assign(set.headers, cors.headers(request))
    return refusalOf(request, routes, cors)
  }
  return (
    new Elysia({ name: 'http-errors' })
      .onRequest(
        answered
          ? async ({ request, set }) => {
              const refusal = await atTheDoor(request, set)
              if (refusal !== undefined) answered(set, undefined, request, refusal.status)
              return refusal
            }
          : ({ request, set }) => atTheDoor(request, set),
      )
      // Postgres stores no NUL character and no lone surrogate, and nothing should recurse through a
      // body nested thousands deep: refuse them at the door, whatever the route. Elysia reads which
      // context fields hooks use from their source: this one reads `body`, so every route parses its
      // body unless it says `parse: 'none'`, as each route that takes none does (http.test.ts checks).
      .onTransform({ as: 'global' }, ({ body }) => {
        const problem = unstorable(body)
        if (problem !== null) throw errors.field(problem.path || '/', problem.message)
      })
      .onError(
        { as: 'global' },
        answered
          ? ({ code, error, path, set, route, request }) => {
              const appError = failed(code, error, path, route, request)
              answered(set, route, request, appError.status)
              return renderError(appError)
            }
          : ({ code, error, path, route, request }) => renderError(failed(code, error, path, route, request)),
      )
  )
}

/**
 * The answer to a request refused before routing (OPTIONS answered; its head or body too large, a
 * URL the routes cannot read as sent, a body not JSON on a route that takes one), or none.
 */
async function refusalOf(request: Request, routes: RouteMethods, cors: CrossOrigin | null): Promise<Response | undefined> {
  // Bun lets heads up to 64 KiB through (server-options.ts): over the app's limits, answered here.
  const tooLarge = headTooLarge(request)
  if (tooLarge !== null) return renderError(tooLarge)
  const badTarget = targetProblem(request.url, request.method, routes)
  if (badTarget !== null) return renderError(badTarget)
  if (request.method === 'OPTIONS') return options(request, routes, cors)
  const length = request.headers.get('content-length')
  // A request from the wire has a body only with a length or a transfer coding (RFC 9112, 6.1); one
  // made in process may have one without either. Asking for `request.body` costs more than this
  // whole check, so a GET or HEAD, whose body no route reads (Elysia parses none), is not asked.
  if (length === null && !request.headers.has('transfer-encoding') && (bodyUnread(request.method) || request.body === null)) return undefined
  // Media types are case-insensitive (RFC 9110), but Elysia reads only the lower-case spelling as
  // JSON: `Application/JSON` would arrive as no body at all. Spelled the one way here instead of
  // parsed here, so the OpenAPI document keeps Elysia's own JSON request schemas.
  const type = request.headers.get('content-type')
  if (type !== null && !type.startsWith('application/json') && isJson(type)) {
    request.headers.set('content-type', `application/json${type.slice('application/json'.length)}`)
  }
  const limit = bodyLimit(request)
  // Without a length (chunked), measure a copy, no further than the limit.
  const size = length !== null ? Number(length) : await chunkedSize(request, limit)
  if (size === null) return renderError(errors.validation('The request body could not be read (the connection closed while it was sent)'))
  // Bun reads and drops the body the app did not read, so that the connection serves the next
  // request; a body declared past `drainBytes`, or chunked (no end in sight), closes it instead.
  if (size > limit) return renderError(errors.payloadTooLarge(limit, length === null || size > drainBytes))
  // An empty body is no body, however it came: Bun hands one of length 0 over as none, but one that
  // came chunked (or one made in process) as an empty stream, which Elysia would parse as JSON and
  // answer `invalid_json` where the route needs no body (a device decision, a purchase). Without its
  // media type Elysia reads none.
  if (size === 0) {
    request.headers.delete('content-type')
    return undefined
  }
  // On a route that takes a body, anything but JSON is refused unread (elsewhere the router's 404
  // or 405 says more, or the body is not read): a form would be read as one, and a body without a
  // media type not at all, so it would pass for none (a device decision of "deny" sent so would approve).
  if (!routes.takesBody(request.method, pathOf(request.url))) return undefined
  const refused = unreadable(type, request.headers.get('content-encoding'))
  return refused === null ? undefined : renderError(refused)
}

/**
 * Why a body cannot be read as JSON, or null: not JSON, in another charset than UTF-8 (RFC 8259,
 * 8.1), or under a content coding, none of which is decoded (RFC 9110, 8.4.1): read as is, either
 * would be a 400 `invalid_json` that never says why.
 */
function unreadable(type: string | null, coding: string | null): AppError | null {
  if (type === null || !isJson(type)) return errors.unsupportedMediaType()
  const charset = /;\s*charset\s*=\s*"?([^";\s]*)/i.exec(type)?.[1]
  if (charset !== undefined && !/^utf-?8$/i.test(charset)) return errors.unsupportedCharset()
  if (coding !== null && coding.trim().toLowerCase() !== 'identity') return errors.unsupportedCoding()
  return null
}

const bodyUnread = (method: string) => method === 'GET' || method === 'HEAD'

const isJson = (type: string) => /^application\/json\s*(;|$)/i.test(type)

/** The path of a request's URL, without parsing all of it. */
const pathOf = (url: string) => {
  const start = url.indexOf('/', url.indexOf('//') + 2)
  const query = url.indexOf('?', start)
  return query === -1 ? url.slice(start) : url.slice(start, query)
}

/**
 * OPTIONS on a path the service has: which methods it takes (no route answers OPTIONS itself), and
 * for a preflight from an allowed page what it may send. A preflight elsewhere (another origin, a
 * path the service does not have: 404) carries no such header, and the browser sends nothing more.
 */
function options(request: Request, routes: RouteMethods, cors: CrossOrigin | null): Response | undefined {
  const allowed = routes.allowed(pathOf(request.url))
  if (!allowed) return undefined
  return new Response(null, { status: 204, headers: { allow: allowed.join(', '), ...cors?.preflight(request, allowed) } })
}

/** How deep objects and arrays may nest in a JSON body. */
export const maxJsonDepth = 64

const badTextMessage = 'must not contain NUL characters or unpaired surrogates'
const tooDeepMessage = `must not nest objects and arrays more than ${maxJsonDepth} deep`
const tooLargeNumberMessage = 'must be a number of at most about 1.8e308 in size (a 64-bit float)'

/**
 * The first thing in a (JSON) body that Postgres could not store (a NUL or a lone surrogate in a
 * string or a key, a number past a 64-bit float's range), or that nests deeper than `maxJsonDepth`,
 * with its JSON pointer; null when there is none.
 * An object's keys are looked at before its values. The walk goes no deeper than `maxJsonDepth`, so
 * no body can exhaust the call stack, and it builds the pointer only for what it finds.
 */
function unstorable(body: unknown): { path: string; message: string } | null {
  // The pointer's segments, innermost first: each level adds its own on the way back out.
  const trail: string[] = []
  const message = problemIn(body, 0, trail)
  return message === null
    ? null
    : {
        path: trail
          .reverse()
          .map(segment => `/${segment}`)
          .join(''),
        message,
      }
}

function problemIn(value: unknown, depth: number, trail: string[]): string | null {
  if (typeof value === 'string') return isStorableText(value) ? null : badTextMessage
  // JSON's 1e400 parses as Infinity, which would be stored as null.
  if (typeof value === 'number') return Number.isFinite(value) ? null : tooLargeNumberMessage
  if (value === null || typeof value !== 'object') return null
  if (depth === maxJsonDepth) return tooDeepMessage
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = problemIn(value[i], depth + 1, trail)
      if (found !== null) return (trail.push(String(i)), found)
    }
    return null
  }
  const keys = Object.keys(value)
  for (const key of keys) {
    if (!isStorableText(key)) return (trail.push(key.replace(/[^\x20-\x7e]/g, '?')), badTextMessage)
  }
  for (const key of keys) {
    const found = problemIn((value as Record<string, unknown>)[key], depth + 1, trail)
    if (found !== null) return (trail.push(key), found)
  }
  return null
}

export const maxBodyBytes = 2 * 1024 * 1024

/** How large a refused body may be declared and still be read through, keeping the connection open (Bun's former cap). */
const drainBytes = 4 * maxBodyBytes

/**
 * The size of a chunked body, read from a copy, or past `limit` as soon as it is over it (the copy's
 * reading stops there, so no body costs more than a limit's memory); null when it cannot be read
 * (the client went away while sending it).
 */
async function chunkedSize(request: Request, limit: number): Promise<number | null> {
  const reader = request.clone().body?.getReader()
  if (!reader) return 0
  let size = 0
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return size
      size += value.byteLength
      if (size > limit) {
        reader.cancel().catch(() => {})
        return size
      }
    }
  } catch {
    return null
  }
}

function bodyLimit(request: Request): number {
  // The path starts at the first slash after the scheme's; cheaper than parsing the whole URL.
  const url = request.url
  return url.startsWith('/v1/billing/configs', url.indexOf('/', url.indexOf('//') + 2)) ? maxBodyBytes : 1024 * 1024
}
