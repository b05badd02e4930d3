/** The error catalogue: every failure a client can see, with its status and stable code. */

export interface ErrorDetail {
  path: string
  message: string
}

/** The one error type that crosses slice boundaries; rendered by the HTTP error handler. */
export class AppError extends Error {
  override name = 'AppError'
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: ErrorDetail[],
    readonly headers?: Record<string, string>,
  ) {
    super(message)
  }
}

// Every 503 says when to try again (a second unless the caller knows better): the agent's reference
// loop, and clients generally, wait for Retry-After rather than guess.
const unavailable = (message: string, retryAfterSeconds: number, details?: ErrorDetail[]) =>
  new AppError(503, 'unavailable', message, details, { 'retry-after': String(retryAfterSeconds) })

/**
 * The message with the first of its details, for clients that show only `message` (the reference
 * polling loop, the MCP server): `The request body is not valid: /rating must be <= 5 (and 1 more)`.
 */
function withFirstProblem(message: string, details?: ErrorDetail[]): string {
  const [first, ...more] = details ?? []
  if (!first) return message
  // A path names the client's own keys, which may be long: the message keeps a readable share.
  const problem = `${first.path} ${first.message}`
  // Cut by code points, so no surrogate pair is split.
  const shown = problem.length > 300 ? `${[...problem].slice(0, 299).join('')}…` : problem
  return `${message}: ${shown}${more.length > 0 ? ` (and ${more.length} more)` : ''}`
}

export const errors = {
  validation: (message: string, details?: ErrorDetail[]) => new AppError(400, 'validation_failed', withFirstProblem(message, details), details),
  field: (path: string, message: string) => errors.validation('The request is not valid', [{ path, message }]),
  invalidJson: () => new AppError(400, 'invalid_json', 'The request body is not valid JSON'),
  invalidCursor: () => new AppError(400, 'invalid_cursor', 'The cursor is not valid'),

  unauthorized: () => new AppError(401, 'unauthorized', 'A credential is required'),
  invalidToken: (message = 'The credential is invalid, expired or revoked') => new AppError(401, 'invalid_token', message),

  forbidden: (message = 'You may not do this') => new AppError(403, 'forbidden', message),
  userOnly: () => new AppError(403, 'forbidden', 'This endpoint needs a user credential, not an agent key'),
  agentOnly: () => new AppError(403, 'forbidden', 'This endpoint needs an agent key'),
  notSubscribed: () => new AppError(403, 'not_subscribed', 'An active subscription to this agent is required'),
  notACustomer: () => new AppError(403, 'not_a_customer', 'Only customers of this agent may review it'),
  blogDisabled: () =>
    new AppError(
      403,
      'blog_disabled',
      'Blog is not enabled: the agent’s owner turns it on with settings.blogEnabled true on PATCH /v1/participants/{id}',
    ),
  confidenceNotAllowed: () => new AppError(403, 'confidence_not_allowed', 'Agents may write only derived or suggested entries'),
  // The same refusal as a user_provided confidence: a claim of the user's own word, made through the source.
  userProvenanceNotAllowed: () =>
    new AppError(403, 'confidence_not_allowed', 'Agents may not claim the user’s provenance; only the user’s own credential writes it', [
      { path: '/source/method', message: 'must not be "user", "user_provided" or "revert:v<N>"' },
    ]),
  cannotSubscribeOwnAgent: () => new AppError(403, 'cannot_subscribe_own_agent', 'You cannot subscribe to your own agent'),
  cannotReviewOwnAgent: () => new AppError(403, 'cannot_review_own_agent', 'You cannot review your own agent'),
  cannotBuyOwnConfig: () => new AppError(403, 'cannot_buy_own_config', 'You cannot buy your own config'),

  notFound: (what = 'Resource') => new AppError(404, 'not_found', `${what} not found`),
  connectionNotFound: () => new AppError(404, 'connection_not_found', 'No connected account for that provider'),
  /** `allow`: the methods the path takes, for the Allow header. */
  methodNotAllowed: (method: string, allow: string[]) =>
    new AppError(405, 'method_not_allowed', `This path does not take ${method}; it takes ${allow.join(', ')}`, undefined, {
      allow: allow.join(', '),
    }),

  alreadySubscribed: () => new AppError(409, 'already_subscribed', 'You already have an active subscription to this agent'),
  alreadyCancelled: () => new AppError(409, 'already_cancelled', 'The subscription is already cancelled'),
  planInactive: () => new AppError(409, 'plan_inactive', 'The plan is no longer offered'),
  configInactive: () => new AppError(409, 'config_inactive', 'The config is no longer for sale'),
  priceChanged: (priceCents: number) =>
    new AppError(409, 'price_changed', `The price is now ${priceCents} cents, not the expected one; nothing was charged`),
  termsChanged: (terms: { monthlyPriceCents: number; includedProxyCalls: number; overagePerCallCents: number }) =>
    new AppError(
      409,
      'price_changed',
      `The plan's terms are now ${terms.monthlyPriceCents} cents a month, ${terms.includedProxyCalls} calls included and ` +
        `${terms.overagePerCallCents} cents a call over them, not the expected ones; nothing was charged`,
    ),
  alreadyResponded: () => new AppError(409, 'already_responded', 'The request has already been answered'),
  userProvidedPrecedence: () => new AppError(409, 'user_provided_precedence', 'The user has set this entry; agents cannot override it'),
  nameTaken: () => new AppError(409, 'name_taken', 'That name is taken'),
  providerTaken: () => new AppError(409, 'name_taken', 'You already have a connection for this provider; delete it first'),
  idempotencyInProgress: (retryAfterSeconds: number) =>
    new AppError(
      409,
      'idempotency_key_in_progress',
      'A request with this Idempotency-Key is still in progress; retry after Retry-After seconds',
      undefined,
      {
        'retry-after': String(retryAfterSeconds),
      },
    ),
  idempotencyKeyReused: () => new AppError(409, 'idempotency_key_reused', 'The Idempotency-Key was used with a different request'),

  /** `close`: the connection is closed after the answer instead of reading the rest of the body. */
  payloadTooLarge: (limit: number, close = false) =>
    new AppError(413, 'payload_too_large', `The request body is over ${limit} bytes`, undefined, close ? { connection: 'close' } : undefined),
  unsupportedMediaType: () => new AppError(415, 'unsupported_media_type', 'The request body must be JSON, sent with Content-Type: application/json'),
  unsupportedCharset: () => new AppError(415, 'unsupported_media_type', 'JSON is read as UTF-8 only: send it so, with charset=utf-8 or none'),
  /** RFC 9110, 12.5.3: a 415 for a content coding says which codings are taken. */
  unsupportedCoding: () =>
    new AppError(415, 'unsupported_media_type', 'No content coding is decoded: send the body without Content-Encoding', undefined, {
      'accept-encoding': 'identity',
    }),
  uriTooLong: (limit: number) => new AppError(414, 'uri_too_long', `The request URL (path and query) is over ${limit} bytes`),
  headersTooLarge: (limit: number) => new AppError(431, 'headers_too_large', `The request line and headers are over ${limit} bytes`),

  rateLimited: (retryAfterSeconds: number) =>
    new AppError(429, 'rate_limited', 'Too many requests', undefined, {
      'retry-after': String(retryAfterSeconds),
    }),
  tooManyOpenRequests: (retryAfterSeconds: number) =>
    new AppError(
      429,
      'too_many_open_requests',
      'The target agent holds as many open service requests (from you, or in all) as it may; try again once it has answered some',
      undefined,
      { 'retry-after': String(retryAfterSeconds) },
    ),
  tooManyInFlight: (retryAfterSeconds: number) =>
    new AppError(429, 'rate_limited', 'Too many of your calls are in progress; try again when one has finished', undefined, {
      'retry-after': String(retryAfterSeconds),
    }),
  slowDown: (retryAfterSeconds: number) =>
    new AppError(429, 'slow_down', 'Polling too fast; wait longer between polls', undefined, {
      'retry-after': String(retryAfterSeconds),
    }),

  upstreamUnreachable: () => new AppError(502, 'upstream_unreachable', 'The upstream could not be reached'),
  upstreamTooLarge: () => new AppError(502, 'upstream_too_large', 'The upstream response was over 1 MiB'),
  upstreamTimeout: () => new AppError(504, 'upstream_timeout', 'The upstream did not answer in time'),
  upstreamRefused: () =>
    new AppError(
      403,
      'forbidden',
      'The connection’s address is not allowed: it resolves to a private, loopback, link-local or other special-purpose address',
    ),
  unavailable: (message = 'A backing service is unavailable; try again', retryAfterSeconds = 1) => unavailable(message, retryAfterSeconds),
  // The operator's to fix (the key that sealed it configured again), not the caller's: a 503 to retry.
  credentialUnreadable: () =>
    unavailable(
      'The connected account’s stored credential cannot be read with this server’s keys; the upstream was not called and nothing was metered',
      60,
    ),
  notReady: (details: ErrorDetail[]) => unavailable('The service is not ready for traffic', 1, details),
  backingDown: (details: ErrorDetail[]) => unavailable('Postgres or Redis is unreachable', 1, details),
  /** With `requestId`, the reference its log record holds, in the message and in `X-Request-Id`. */
  internal: (requestId?: string) =>
    requestId === undefined
      ? new AppError(500, 'internal', 'Something went wrong on our side')
      : new AppError(500, 'internal', `Something went wrong on our side (request ${requestId})`, undefined, { 'x-request-id': requestId }),
}

/**
 * Awaits a request's checks made together (independent reads of PostgreSQL and Redis: one round trip
 * for them all rather than one each, which is what a request pays for when its servers are far away)
 * and fails as if they had been made one after another: with the first failure in the order given
 * (a rate limit before an unknown agent before a missing subscription). The others still settle, so
 * no rejection goes unhandled.
 */
export async function inOrder<T extends readonly unknown[]>(checks: T): Promise<{ -readonly [K in keyof T]: Awaited<T[K]> }> {
  const settled = await Promise.allSettled(checks)
  for (const outcome of settled) if (outcome.status === 'rejected') throw outcome.reason
  return settled.map(outcome => (outcome as PromiseFulfilledResult<unknown>).value) as { -readonly [K in keyof T]: Awaited<T[K]> }
}
