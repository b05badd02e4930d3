/**
 * String formats checked on every request and response. @elysiajs/openapi (through @sinclair/typemap)
 * replaces TypeBox's `uuid` check on import with one that builds a Zod schema per call (about 20 µs,
 * most of a poll's cost); these precompiled checks go back in after it.
 */
import { FormatRegistry } from '@sinclair/typebox'

// Lower case only: ids are compared as text in Redis keys and in the code, so an upper-case spelling
// of a known id is refused (400) rather than quietly treated as another id.
const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** Whether a string is a UUID in lower case (lower-case it first to accept either). */
export const isUuid = (value: string) => uuid.test(value)
const dateTime = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i

export function registerFormats(): void {
  FormatRegistry.Set('uuid', value => uuid.test(value))
  FormatRegistry.Set('date-time', value => dateTime.test(value) && !Number.isNaN(Date.parse(value)))
}

/** The token of an `Authorization: Bearer <token>` header (the scheme in any case: RFC 9110), or undefined for any other form. */
export function bearerTokenOf(header: string): string | undefined {
  return /^Bearer[ ]+([^\s]+)[ ]*$/i.exec(header)?.[1]
}
