/**
 * What the fuzzer holds every answer to: the developers' rule ("bad input gets a clear 4xx in the
 * contract's envelope and changes nothing; a 500 from anything a client can send is a bug") and the
 * OpenAPI document (each status documented, each 2xx body of its documented schema).
 */
// Ajv comes with @apidevtools/swagger-parser (a dev dependency): the JSON Schema 2020-12 validator
// the document's schemas are written for. TypeBox's Value checks TypeBox schemas, not the document's.
import Ajv2020, { type ValidateFunction } from 'ajv/dist/2020.js'
import type { Db } from '../../src/db.ts'
import type { Schema } from './fuzz-values.ts'

/** The error codes each status may carry (the contract's table, and the catalogue's additions in src/errors.ts). */
export const codeFamilies: Record<number, string[]> = {
  400: ['validation_failed', 'invalid_json', 'invalid_cursor'],
  401: ['unauthorized', 'invalid_token'],
  403: [
    'forbidden',
    'not_subscribed',
    'not_a_customer',
    'blog_disabled',
    'confidence_not_allowed',
    'cannot_subscribe_own_agent',
    'cannot_review_own_agent',
    'cannot_buy_own_config',
  ],
  404: ['not_found', 'connection_not_found'],
  405: ['method_not_allowed'],
  409: [
    'already_subscribed',
    'already_cancelled',
    'plan_inactive',
    'config_inactive',
    'price_changed',
    'already_responded',
    'user_provided_precedence',
    'name_taken',
    'idempotency_key_in_progress',
    'idempotency_key_reused',
  ],
  413: ['payload_too_large'],
  414: ['uri_too_long'],
  415: ['unsupported_media_type'],
  429: ['rate_limited', 'too_many_open_requests', 'slow_down'],
  431: ['headers_too_large'],
  502: ['upstream_unreachable', 'upstream_too_large'],
  503: ['unavailable'],
  504: ['upstream_timeout'],
}

/** Statuses an upstream's failure explains (proxy calls): not the service's own fault. */
const upstreamStatuses = [502, 504]

export interface Operation {
  operationId: string
  method: string
  path: string
  parameters?: { name: string; in: string; required?: boolean; schema: Schema }[]
  requestBody?: { required?: boolean; content: Record<string, { schema: Schema }> }
  responses: Record<string, { content?: Record<string, { schema?: Schema }> }>
  /** Alternatives of credentials; an empty one means none is needed. */
  security?: object[]
}

export interface Answer {
  status: number
  headers: Headers
  /** Parsed JSON, text, or null for a stream (not read). */
  body: unknown
}

/** The document's operations, references resolved, with a validator for each schema they name. */
export function documentOracle(resolved: any) {
  const ajv = new Ajv2020({ strict: false, allErrors: true })
  // As the service writes them: lower-case UUIDs, ISO times, 64-bit integers.
  ajv.addFormat('uuid', /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
  ajv.addFormat('date-time', {
    validate: (value: string) =>
      /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i.test(value) && !Number.isNaN(Date.parse(value)),
  })
  ajv.addFormat('int64', { type: 'number', validate: (value: number) => Number.isSafeInteger(value) })
  const compiled = new Map<object, ValidateFunction>()
  const validator = (schema: Schema) => {
    let validate = compiled.get(schema)
    if (!validate) compiled.set(schema, (validate = ajv.compile(schema)))
    return validate
  }
  const errorsOf = (schema: Schema, value: unknown): string[] => {
    const validate = validator(schema)
    return validate(value) ? [] : (validate.errors ?? []).slice(0, 3).map(e => `${e.instancePath || '/'} ${e.message}`)
  }

  const operations: Operation[] = Object.entries<Record<string, any>>(resolved.paths).flatMap(([path, item]) =>
    Object.entries<any>(item)
      .filter(([method]) => ['get', 'put', 'post', 'patch', 'delete'].includes(method))
      .map(([method, operation]) => ({ ...operation, method: method.toUpperCase(), path })),
  )

  /**
   * Every way `answer` breaks the rule or the document for `operation` (empty when it holds). Off its
   * route (another path than the operation's), only the rule holds: under 500, and 4xx in the envelope.
   */
  function violations(operation: Operation, answer: Answer, onRoute = true, head = false): string[] {
    const { status, headers, body } = answer
    const found: string[] = []
    const documented = operation.responses[String(status)]
    if (status >= 500 && !(upstreamStatuses.includes(status) && documented)) found.push(`status ${status}`)
    const type = (headers.get('content-type') ?? '').split(';')[0]!.trim()
    // Another route's answer: its pages answer their 404s in HTML.
    if (!onRoute) return status >= 400 && !head && type !== 'text/html' ? [...found, ...envelopeProblems(status, headers, body)] : found
    if (!documented) found.push(`status ${status} is not documented`)
    // A HEAD is its GET's answer without the body.
    if (head) return found
    const content = documented?.content
    if (content && Object.keys(content).length > 0 && !content[type]) found.push(`content-type ${type || 'none'} is not documented for ${status}`)
    if (status >= 400 && type === 'application/json') found.push(...envelopeProblems(status, headers, body))
    else if (status >= 400 && !(content?.[type] || type === 'text/html')) found.push(`a ${status} not in the envelope (${type || 'no content-type'})`)
    const schema = content?.[type]?.schema
    if (status < 300 && type === 'application/json' && schema) {
      found.push(...errorsOf(schema, body).map(error => `2xx body breaks its schema: ${error}`))
    }
    return found
  }

  return { operations, violations, errorsOf }
}

function envelopeProblems(status: number, headers: Headers, body: unknown): string[] {
  const envelope = body as { success?: unknown; statusCode?: unknown; error?: unknown; message?: unknown; details?: unknown } | null
  if (typeof envelope !== 'object' || envelope === null) return [`${status} body is not the envelope`]
  const found: string[] = []
  if (envelope.success !== false) found.push('envelope success is not false')
  if (envelope.statusCode !== status) found.push(`envelope statusCode ${String(envelope.statusCode)} is not ${status}`)
  if (typeof envelope.message !== 'string' || envelope.message.length === 0) found.push('envelope has no message')
  const family = codeFamilies[status] ?? []
  if (typeof envelope.error !== 'string' || !family.includes(envelope.error))
    found.push(`code ${String(envelope.error)} is not of the ${status} family`)
  // The contract: validation failures add details, [{path, message}], saying where.
  if (envelope.error === 'validation_failed' && !Array.isArray(envelope.details)) found.push('validation_failed without details')
  if (envelope.details !== undefined) {
    const details = envelope.details as { path?: unknown; message?: unknown }[]
    if (!Array.isArray(details) || details.some(d => typeof d?.path !== 'string' || typeof d?.message !== 'string')) found.push('details malformed')
  }
  const text = JSON.stringify(body)
  if (/\bat .*\.(ts|js):\d+|syntax error at or near|duplicate key value|violates .* constraint/i.test(text)) found.push('a stack or SQL text leaked')
  if (status === 401 && !headers.get('www-authenticate')) found.push('401 without WWW-Authenticate')
  if ((status === 429 || status === 503) && !/^\d+$/.test(headers.get('retry-after') ?? '')) found.push(`${status} without Retry-After`)
  return found
}

/**
 * Tables a refused request must leave as they were. Left out: bookkeeping of requests and actors, and
 * the chat clock (a post takes its millisecond before it is checked: a refusal leaves it unused).
 */
const bookkeeping = ['outbox', 'idempotency_keys', 'actor_applied', 'actor_fences', 'migrations', 'chat_clock']

/**
 * What every table the service keeps holds, cheaply: its row count and its newest row version (an
 * insert or an update writes a newer `xmin`, a delete lowers the count). API keys by their content
 * instead, but for when a key was last used (written in batches, whatever the request).
 */
export async function stateDigest(sql: Db): Promise<Record<string, string>> {
  const tables = await sql<{ name: string }[]>`
    select table_name as name from information_schema.tables
    where table_schema = 'public' and table_type = 'BASE TABLE' and not (table_name = any(${bookkeeping}))
    order by table_name
  `
  // One statement for every table: a digest is taken before and after each sampled write.
  const parts = tables.map(({ name }) =>
    name === 'api_keys'
      ? sql`select ${name} as name, md5(coalesce(string_agg((to_jsonb(t) - 'last_used_at')::text, '|' order by t.id), '')) as digest from api_keys t`
      : sql`select ${name} as name, count(*) || ':' || coalesce(max(xmin::text::bigint), 0) as digest from ${sql(name)}`,
  )
  const union = parts.reduce((all, part) => sql`${all} union all ${part}`)
  const digest: Record<string, string> = {}
  for (const row of await sql<{ name: string; digest: string }[]>`${union}`) digest[row.name] = row.digest
  return digest
}
