/** Limits of a request's URL and head, checked by the app (the server lets it see requests over them: server-options.ts). */
import { errors } from '../errors.ts'

/** The longest request target (path and query) answered; longer is 414 `uri_too_long`. */
export const maxUrlBytes = 8 * 1024
/** The largest request head (request line and headers) answered; larger is 431 `headers_too_large`. Bun's own default. */
export const maxHeadBytes = 16 * 1024
/**
 * What Bun's parser takes before it answers a bare 431 itself, with no JavaScript run: raised from
 * its 16 KiB default so that heads up to this size reach the app and get the envelope.
 */
export const serverHeadBytes = 64 * 1024

/**
 * The request's URL or head over its limit, as the error to answer; null when within them. Sizes are
 * counted in UTF-16 code units of what Bun parsed (header names and values without their `: ` and
 * CRLF, which are counted apart), close enough to bytes for a limit.
 */
export function headTooLarge(request: Request) {
  const url = request.url
  const target = url.length - Math.max(0, url.indexOf('/', url.indexOf('//') + 2))
  if (target > maxUrlBytes) return errors.uriTooLong(maxUrlBytes)
  let size = request.method.length + target + 12
  // Names and `get` rather than `entries()`, which builds a [name, value] pair per header: over a
  // real socket that cost 1.8 µs a request more (bench/notes.md). `get` joins a repeated name's
  // values, as `entries()` does, except Set-Cookie's, which are counted one by one here as there.
  const headers = request.headers
  let cookies = false
  for (const name of headers.keys()) {
    if (name !== 'set-cookie') size += name.length + headers.get(name)!.length + 4
    else if (!cookies) {
      cookies = true
      for (const cookie of headers.getSetCookie()) size += name.length + cookie.length + 4
    }
  }
  return size > maxHeadBytes ? errors.headersTooLarge(maxHeadBytes) : null
}
