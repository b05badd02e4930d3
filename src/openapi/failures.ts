/**
 * The failures every operation documents: those a route declares itself (`failures(...)` in its
 * schema), and those the HTTP layer answers for whole classes of routes, added here by rule.
 */
import type { Schema } from './components.ts'

export interface Operation {
  operationId: string
  security?: Record<string, string[]>[]
  parameters?: { name: string; in: string; required?: boolean; description?: string; schema?: Schema }[]
  requestBody?: { required?: boolean; content: Record<string, { schema: Schema }> }
  responses: Record<string, Response>
  [key: string]: unknown
}

export interface Response {
  description: string
  headers?: Record<string, unknown>
  content?: Record<string, { schema: Schema }>
  $ref?: string
}

const envelope = { $ref: '#/components/schemas/ErrorEnvelope' }
const retryAfter = { description: 'Seconds to wait before trying again', schema: { type: 'integer', minimum: 0 } }
// Sent with idempotency_key_in_progress only (errors.ts), so a route's other 409s come without it.
const inProgressRetryAfter = { ...retryAfter, description: 'With idempotency_key_in_progress: seconds to wait before trying again' }
// RFC 9110, 12.5.3: a 415 for a body with a Content-Encoding names the codings taken (none).
const acceptEncoding = {
  description: 'With a body sent with a Content-Encoding: `identity`, no coding is decoded',
  schema: { type: 'string', const: 'identity' },
}
/** The 409s of every route that honours an Idempotency-Key (src/idempotency/idempotent.ts), besides its own. */
const idempotencyConflicts = [
  'idempotency_key_reused: the Idempotency-Key came with another request',
  'idempotency_key_in_progress: its first request is still running, retry after Retry-After',
] as const

/** What the HTTP layer answers, shared by the operations as `components.responses`. */
export const failureResponses: Record<string, Response> = {
  BadRequest: failure(
    'validation_failed (details name each problem; the message, the first of them), invalid_json or invalid_cursor: the request is not valid. ' +
      'Any route: a path, or a query parameter the route reads, that is not percent-encoded UTF-8 text (a bad escape such as %zz or %FF, a %00; a raw # anywhere), or such a parameter given twice',
  ),
  Unauthorized: {
    ...failure('unauthorized: a credential is needed; invalid_token: the credential is invalid, expired or revoked'),
    headers: {
      'WWW-Authenticate': { description: 'Bearer realm="api", with error="invalid_token" for a bad credential', schema: { type: 'string' } },
    },
  },
  Conflict: {
    ...failure(`${idempotencyConflicts[0]}; ${idempotencyConflicts[1]}`),
    headers: { 'Retry-After': inProgressRetryAfter },
  },
  PayloadTooLarge: failure('payload_too_large: the body is over its limit (1 MiB; 2 MiB for config listings)'),
  UriTooLong: failure('uri_too_long: the path and query are over 8 KiB'),
  UnsupportedMediaType: {
    ...failure('unsupported_media_type: a body must be JSON in UTF-8, sent with Content-Type: application/json and no Content-Encoding'),
    headers: { 'Accept-Encoding': acceptEncoding },
  },
  HeadersTooLarge: failure('headers_too_large: the request line and headers are over 16 KiB'),
  TooManyRequests: {
    ...failure(
      'rate_limited: a rate limit is spent; retry after Retry-After. Any route that takes an API key: the client address sent too many keys that were never issued (rule apiKeyMisses)',
    ),
    headers: { 'Retry-After': retryAfter },
  },
  Internal: {
    ...failure('internal: something went wrong on our side; the message and X-Request-Id give the reference our log holds'),
    headers: {
      'X-Request-Id': {
        description: 'The request’s own X-Request-Id (1 to 128 letters, digits and ._:=+/-), as a proxy in front sends it, or one made for it',
        schema: { type: 'string' },
      },
    },
  },
  Unavailable: {
    ...failure('unavailable: PostgreSQL or Redis cannot be reached, or the service is too busy, right now; retry'),
    headers: { 'Retry-After': retryAfter },
  },
}

/** Operations that reach neither PostgreSQL nor Redis, so are never 503. */
const offline = new Set(['devicePage'])

/** Adds the failures the HTTP layer can answer with to one operation, and the headers its own failures carry. */
export function addFailures(operation: Operation): void {
  const { responses } = operation
  const add = (status: number, name: keyof typeof failureResponses) => {
    responses[status] ??= { $ref: `#/components/responses/${name}` } as Response
  }
  // Every route: its URL is checked at the door (src/http/request-target.ts).
  add(400, 'BadRequest')
  if (operation.security?.some(requirement => Object.keys(requirement).length > 0)) add(401, 'Unauthorized')
  // An API key (sk_, as a bearer token or X-API-Key) the process has not cached may be refused by address.
  if (operation.security?.some(requirement => 'bearer' in requirement || 'apiKey' in requirement)) add(429, 'TooManyRequests')
  const idempotent = operation.parameters?.some(parameter => parameter.in === 'header' && parameter.name === 'idempotency-key')
  if (idempotent) add(409, 'Conflict')
  add(413, 'PayloadTooLarge')
  add(414, 'UriTooLong')
  if (operation.requestBody) add(415, 'UnsupportedMediaType')
  add(431, 'HeadersTooLarge')
  add(500, 'Internal')
  if (!offline.has(operation.operationId)) add(503, 'Unavailable')
  for (const [status, response] of Object.entries(responses)) {
    if (status === '429' && !response.$ref) response.headers = { 'Retry-After': retryAfter, ...response.headers }
    if (status === '503' && !response.$ref) response.headers = { ...failureResponses.Unavailable!.headers, ...response.headers }
    if (status === '401' && !response.$ref) response.headers = { ...failureResponses.Unauthorized!.headers, ...response.headers }
    if (status === '415' && !response.$ref) response.headers = { ...failureResponses.UnsupportedMediaType!.headers, ...response.headers }
    // A route's own 409s (already_subscribed, say) are not all it answers with: the key's are added.
    if (status === '409' && !response.$ref && idempotent) {
      const missing = idempotencyConflicts.filter(text => !response.description.includes(text.slice(0, text.indexOf(':'))))
      if (missing.length > 0) response.description = [response.description, ...missing].join('; ')
      response.headers = { 'Retry-After': inProgressRetryAfter, ...response.headers }
    }
  }
}

function failure(description: string): Response {
  return { description, content: { 'application/json': { schema: envelope } } }
}
