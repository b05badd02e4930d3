/** Shared wire schemas: the success and error envelopes, ids, times and list parameters. */
import { t, type TSchema } from 'elysia'
import type { TProperties } from '@sinclair/typebox'
import { Type, type IntegerOptions } from '@sinclair/typebox'
import { errors } from '../errors.ts'

export const ErrorDetail = t.Object(
  {
    path: t.String({ description: 'JSON pointer to the value, in the body or among the path or query parameters' }),
    message: t.String({ description: 'What is wrong with it' }),
  },
  { $id: 'ErrorDetail', description: 'One problem of a request that is not valid', examples: [{ path: '/rating', message: 'must be <= 5' }] },
)

export const ErrorBody = t.Object(
  {
    success: t.Literal(false),
    statusCode: Type.Integer({ description: 'The HTTP status, repeated' }),
    error: t.String({ description: 'Stable snake_case code: what a client branches on' }),
    message: t.String({ description: 'One human sentence; what to do, where that is not obvious' }),
    details: t.Optional(t.Array(ErrorDetail, { description: 'With validation_failed: each problem found (at most 20)' })),
  },
  {
    $id: 'ErrorEnvelope',
    description: 'What every failure answers with',
    examples: [
      {
        success: false,
        statusCode: 403,
        error: 'blog_disabled',
        message: 'Blog is not enabled: the agent’s owner turns it on with settings.blogEnabled true on PATCH /v1/participants/{id}',
      },
      {
        success: false,
        statusCode: 400,
        error: 'validation_failed',
        message: 'The request body is not valid',
        details: [{ path: '/rating', message: 'must be <= 5' }],
      },
    ],
  },
)

/** The success envelope around a payload schema. */
export const Ok = <S extends TSchema>(data: S) => t.Object({ success: t.Literal(true), data })

/** Wraps a payload in the success envelope. */
export const ok = <T>(data: T) => ({ success: true as const, data })

const errorDescriptions: Record<number, string> = {
  400: 'Invalid request (validation_failed, invalid_json, invalid_cursor)',
  401: 'Missing or invalid credential',
  403: 'Not allowed',
  404: 'Not found, or not visible to the caller',
  409: 'Conflict with the current state',
  413: 'Body too large',
  429: 'Rate limited; see Retry-After',
  502: 'Upstream failed',
  503: 'A backing service is unavailable',
  504: 'Upstream timed out',
}

/** Error responses for a route's documentation, by status. */
export function failures<const S extends readonly number[]>(...statuses: S) {
  const out = {} as Record<S[number], typeof ErrorBody>
  for (const status of statuses) {
    out[status as S[number]] = t.Composite([ErrorBody], { description: errorDescriptions[status] })
  }
  return out
}

/** One error response documented with its own description (the codes a route can answer with, say). */
export const failure = (description: string) => t.Composite([ErrorBody], { description })

/**
 * A strict JSON integer. Elysia's own `t.Integer` also takes numeric strings, which a JSON API
 * should refuse (and which would document the field as a string-or-integer union).
 */
export const Int = (options?: IntegerOptions) => Type.Integer(options)
/**
 * An integer that can pass 2^31 (money summed over time, invoice amounts: bigint in Postgres), so
 * that client generators give it 64 bits (Java's `long`, C#'s `long`): a plain `integer` is 32 there.
 */
export const Int64 = (options?: IntegerOptions) => Type.Integer({ format: 'int64', ...options })

/** Lower-case, as the service writes them (the `uuid` format is registered so: src/http/formats.ts). */
export const Uuid = t.String({ format: 'uuid', description: 'A UUID in lower case' })
/** A UUID that says whose it is (a path parameter, say). */
export const UuidOf = (description: string) => t.String({ format: 'uuid', description })
export const Timestamp = t.String({ format: 'date-time', description: 'ISO 8601 UTC with milliseconds' })
export const NullableTimestamp = t.Union([Timestamp, t.Null()])

export const iso = (date: Date) => date.toISOString()
export const isoOrNull = (date: Date | null | undefined) => (date ? date.toISOString() : null)

/** Where a query parameter's schema carries what the document shows for it instead (openapi/document.ts). */
export const shownAs = 'x-shown-as'

/**
 * A query parameter its route reads from the raw string (strictly, with the contract's message), which
 * the OpenAPI document shows as the value it stands for: an integer, a date-time, as client
 * generators should type it. Validation sees only a string.
 */
export const queryValue = (shown: Record<string, unknown>, description: string, example: unknown) =>
  t.Optional(t.String({ description, [shownAs]: { ...shown, description, examples: [example] } }))

/** A query integer from `minimum` to `maximum` (`fallback` when absent), read by `parse`. */
export function queryInteger(name: string, fallback: number, minimum: number, maximum: number, description: string) {
  // Digits only, and few enough that no string of them costs anything to read (leading zeros allowed).
  const digits = new RegExp(`^[0-9]{1,${Math.max(7, String(maximum).length)}}$`)
  return {
    param: queryValue({ type: 'integer', minimum, maximum, default: fallback }, description, fallback),
    parse(value: string | undefined): number {
      if (value === undefined) return fallback
      if (!digits.test(value) || Number(value) < minimum || Number(value) > maximum) {
        throw errors.field(`/${name}`, `must be an integer from ${minimum} to ${maximum}`)
      }
      return Number(value)
    },
  }
}

/** A `limit` query parameter as the contract has it: a string holding an integer from 1 to `max`. */
export const pageLimit = (fallback: number, max: number) =>
  queryInteger('limit', fallback, 1, max, `How many items at most (default ${fallback}, at most ${max})`)

/** An ISO time query parameter (read leniently by `parseTime`), shown as a date-time. */
export const TimeParam = (description: string) =>
  queryValue(
    { type: 'string', format: 'date-time' },
    `${description} (UTC when it has no offset; an offset’s \`+\` sent unencoded arrives as a space and is read as \`+\`)`,
    '2026-11-22T10:00:00.000Z',
  )

/** A `before` query parameter. */
export const BeforeParam = TimeParam('Only items strictly older than this ISO 8601 time')

/**
 * An ISO 8601 time, read leniently the way clients write them: `T` or a space between date and time,
 * `Z`/`z` or an offset (none means UTC), seconds and a fraction optional. Years 1 to 9999 only.
 * An empty value is the same as none. An offset's `+` sent unencoded arrives as a space (a query is
 * form-encoded), which can stand for nothing else there: it is read as the `+` it was.
 */
export function parseTime(value: string | undefined, path: string): Date | undefined {
  if (value === undefined || value === '') return undefined
  const match = /^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)([Zz]|[+\- ]\d{2}:\d{2})?$/.exec(value)
  if (!match || !isCalendarDate(value) || Number(value.slice(0, 4)) < 1) throw errors.field(path, 'must be an ISO 8601 time')
  const at = new Date(`${match[1]}T${match[2]}${(match[3] ?? 'Z').toUpperCase().replace(' ', '+')}`)
  if (Number.isNaN(at.getTime()) || at.getUTCFullYear() < 1 || at.getUTCFullYear() > 9999) {
    throw errors.field(path, 'must be an ISO 8601 time')
  }
  return at
}

/**
 * A `before` bound, as parseTime reads it, rounded up to the next millisecond when finer than one: a
 * Date keeps milliseconds only, and truncating `…00.0005Z` to `…00.000Z` would leave out the items of
 * that millisecond, which are strictly older than the bound. Every paged list's times are whole
 * milliseconds (their writers date items with Dates), so the rounded bound leaves out exactly what
 * the exact one would. Past the last millisecond of year 9999 it is no bound: no time stored is
 * later (Postgres cannot take the year 10000 a Date would be sent as, so none is written), and that
 * bound cannot be sent either.
 */
export function parseBefore(value: string | undefined, path: string): Date | undefined {
  const at = parseTime(value, path)
  const finer = /\.\d{3}(\d+)/.exec(value ?? '')?.[1]
  if (!at || !finer || !/[1-9]/.test(finer)) return at
  return at.getTime() < lastMillisecond ? new Date(at.getTime() + 1) : undefined
}

const lastMillisecond = Date.UTC(9999, 11, 31, 23, 59, 59, 999)

/** A query schema that ignores parameters it does not know (tracking tags and the like), as web APIs do. */
export const Query = <P extends TProperties>(properties: P) => t.Object(properties, { additionalProperties: true })

/** Whether the YYYY-MM-DD at the start is a real day: Date would read February 30 as March 2. */
function isCalendarDate(value: string): boolean {
  const [year, month, day] = [Number(value.slice(0, 4)), Number(value.slice(5, 7)), Number(value.slice(8, 10))]
  return month >= 1 && month <= 12 && day >= 1 && day <= new Date(Date.UTC(year, month, 0)).getUTCDate()
}
