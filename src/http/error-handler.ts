/** Renders every failure, ours and the framework's, as the contract's error envelope. */
import { Elysia, ValidationError } from 'elysia'
import { AppError, errors, type ErrorDetail } from '../errors.ts'
import { errorFields, type Log } from '../log.ts'
import { isBadInput, isConnectionError } from '../db.ts'
import { isRedisUnavailable } from '../redis.ts'

export function renderError(error: AppError): Response {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...error.headers }
  if (error.status === 401) {
    headers['www-authenticate'] =
      error.code === 'invalid_token' ? 'Bearer realm="api", error="invalid_token"' : 'Bearer realm="api"'
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

/** Maps anything thrown to the AppError a client should see; logs what is our fault. */
export function toAppError(code: unknown, error: unknown, log: Log, path: string): AppError {
  if (error instanceof AppError) return error
  if (error instanceof ValidationError) {
    if (error.type === 'response') {
      log.error('response failed its own schema', { path, ...errorFields(error) })
      return errors.internal()
    }
    return errors.validation(`The ${parts[error.type] ?? 'request'} ${error.type === 'body' ? 'is' : 'are'} not valid`, validationDetails(error))
  }
  switch (code) {
    case 'NOT_FOUND':
      return errors.notFound('Route')
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
  if (isConnectionError(error) || isRedisUnavailable(error)) {
    log.error('backing service unavailable', { path, ...errorFields(error) })
    return errors.unavailable()
  }
  log.error('unhandled error', { path, ...errorFields(error) })
  return errors.internal()
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
  for (const issue of error.all) {
    const path = 'path' in issue && typeof issue.path === 'string' ? issue.path : ''
    const message = 'message' in issue && typeof issue.message === 'string' ? issue.message : 'is not valid'
    const line = `${path}\u0000${message}`
    if (seen.has(line)) continue
    seen.add(line)
    details.push({ path: path || '/', message })
    if (details.length === 20) break
  }
  return details
}

/**
 * The global error handler and the body size limit, as one plugin. Bodies are capped per route
 * family (config listings carry files, so they get more). JSON is parsed by Elysia's own parser, so
 * the OpenAPI document keeps every request schema; its parse failures render as `invalid_json`.
 */
export function httpErrors(log: Log) {
  return new Elysia({ name: 'http-errors' })
    .onRequest(async ({ request }) => {
      if (request.body === null) return undefined
      const limit = bodyLimit(request)
      const length = request.headers.get('content-length')
      // Without a length (chunked), measure a copy; Bun's server-wide cap bounds what that can cost.
      const size = length !== null ? Number(length) : (await request.clone().arrayBuffer()).byteLength
      return size > limit ? renderError(errors.payloadTooLarge(limit)) : undefined
    })
    // Postgres stores no NUL character and no lone surrogate: refuse them at the door, whatever the route.
    .onTransform({ as: 'global' }, ({ body }) => {
      const where = unstorable(body, '')
      if (where !== null) throw errors.field(where || '/', 'must not contain NUL characters or unpaired surrogates')
    })
    .onError({ as: 'global' }, ({ code, error, path }) => renderError(toAppError(code, error, log, path)))
}

const badText = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** The JSON pointer of the first string (or key) Postgres could not store, or null. */
function unstorable(value: unknown, path: string): string | null {
  if (typeof value === 'string') return badText.test(value) ? path : null
  if (value === null || typeof value !== 'object') return null
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = unstorable(value[i], `${path}/${i}`)
      if (found !== null) return found
    }
    return null
  }
  for (const [key, child] of Object.entries(value)) {
    if (badText.test(key)) return `${path}/${key.replace(/[^\x20-\x7e]/g, '?')}`
    const found = unstorable(child, `${path}/${key}`)
    if (found !== null) return found
  }
  return null
}

export const maxBodyBytes = 2 * 1024 * 1024

function bodyLimit(request: Request): number {
  return new URL(request.url).pathname.startsWith('/v1/billing/configs') ? maxBodyBytes : 1024 * 1024
}
