/**
 * Cross-origin requests from browsers (CORS): which pages on other origins (CORS_ORIGINS) may call
 * the API and read its answers, what they may send, and which response headers they may read.
 */

/** A CORS_ORIGINS entry for every origin: answered with `*`, the only wildcard (see `originList`). */
export const anyOrigin = '*'

/**
 * The request headers a page may send beyond the CORS-safelisted ones: the ones the API reads.
 * `X-API-Key` too, since an agent key is as good as `Authorization: Bearer sk_agt_...`, which a page
 * may send anyway; `Last-Event-ID` for a stream a page resumes with fetch rather than EventSource.
 */
export const allowedRequestHeaders = ['authorization', 'content-type', 'idempotency-key', 'last-event-id', 'x-api-key']

/**
 * The response headers a page may read beyond the CORS-safelisted ones (Content-Type, Cache-Control
 * and such): every other one the API sends a client. Without them a page would see a 429 but not
 * its Retry-After. A test checks every error of the catalogue against this list.
 */
export const exposedResponseHeaders = ['accept-encoding', 'allow', 'retry-after', 'www-authenticate', 'x-request-id']

/**
 * How long a browser may keep a preflight's answer (per page origin, URL and method): Chromium's
 * ceiling, 2 hours (Firefox's is a day). A dashboard calls many URLs, each of which needs one.
 */
export const preflightMaxAgeSeconds = 7200

export interface CrossOrigin {
  /**
   * The headers every answer to `request` carries: `Vary: Origin` wherever the answer depends on the
   * origin (a cache must not give one page's answer to another), and for a page allowed to read it
   * `Access-Control-Allow-Origin` and `-Expose-Headers`.
   */
  headers(request: Request): Readonly<Record<string, string>>
  /**
   * What an OPTIONS answer adds, besides `headers`, to be a preflight's for an allowed page (the path
   * takes `methods`, the API reads `allowedRequestHeaders`, for `preflightMaxAgeSeconds`), or null for
   * any other OPTIONS request. The browser compares what its request needs with them and sends it, or
   * refuses it without sending it.
   */
  preflight(request: Request, methods: readonly string[]): Record<string, string> | null
}

/**
 * The policy for CORS_ORIGINS's entries (from `originList`), or null for none: then no answer carries
 * a CORS header, and browsers let no page on another origin read one (nor send what needs a preflight).
 * Credentials are never allowed (no `Access-Control-Allow-Credentials`): the API reads no cookie, and
 * a page sends its token in a header, which needs none; so `*` lets every page call with a token it
 * holds, and no page act with one it does not.
 *
 * @example
 * const cors = crossOrigin(['https://app.example.com'])
 * cors?.headers(request) // { vary: 'Origin', 'access-control-allow-origin': 'https://app.example.com', ... } for that page
 */
export function crossOrigin(origins: readonly string[]): CrossOrigin | null {
  if (origins.length === 0) return null
  const any = origins.includes(anyOrigin)
  const allowed = new Set(origins)
  const expose = exposedResponseHeaders.join(', ')
  const requestHeaders = allowedRequestHeaders.join(', ')
  const maxAge = String(preflightMaxAgeSeconds)
  // Answers with `*` do not depend on the origin; the others do, whether or not they allow the page.
  const base: Readonly<Record<string, string>> = any ? {} : { vary: 'Origin' }
  const allow = (origin: string | null) => (origin === null ? null : any ? anyOrigin : allowed.has(origin) ? origin : null)
  const headers = (request: Request) => {
    const origin = allow(request.headers.get('origin'))
    return origin === null ? base : { ...base, 'access-control-allow-origin': origin, 'access-control-expose-headers': expose }
  }
  return {
    headers,
    preflight(request, methods) {
      if (!request.headers.has('access-control-request-method') || allow(request.headers.get('origin')) === null) return null
      return {
        'access-control-allow-methods': methods.join(', '),
        'access-control-allow-headers': requestHeaders,
        'access-control-max-age': maxAge,
      }
    },
  }
}

/**
 * Checks CORS_ORIGINS's entries: each an origin exactly as a browser sends it in `Origin`
 * (`https://app.example.com`, `http://localhost:5173`: a scheme, a lower-case host, a port unless the
 * scheme's default, nothing after), or `*` alone. Throws naming the first entry that is not, with the
 * origin meant where there is one: an entry that differs from every `Origin` by a slash would match
 * nothing, silently. No pattern (`https://*.example.com`) and no `null` (the origin of sandboxed
 * frames and files, which any page can give itself).
 */
export function originList(entries: readonly string[]): string[] {
  if (entries.includes(anyOrigin) && entries.length > 1) throw new Error(`"${anyOrigin}" (every origin) must stand alone`)
  for (const entry of entries) {
    if (entry === anyOrigin) continue
    if (entry.includes('*')) throw new Error(`"${entry}" is a pattern: list each origin (or ${anyOrigin} alone for every one)`)
    let origin: string
    try {
      const url = new URL(entry)
      origin = url.protocol === 'http:' || url.protocol === 'https:' ? url.origin : 'null'
    } catch {
      origin = 'null'
    }
    if (origin === 'null') throw new Error(`"${entry}" is not an http:// or https:// origin (scheme://host[:port])`)
    if (origin !== entry) throw new Error(`"${entry}" is not an origin as a browser sends it: ${origin}`)
  }
  return [...entries]
}
