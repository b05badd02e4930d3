/**
 * What caches between the API and its callers (a proxy's `proxy_cache`, a CDN, a browser) may do with
 * its answers: keep none of them, unless a route serves a document that is the same for every caller.
 */
import { createHash } from 'node:crypto'

/**
 * Every answer's Cache-Control unless its route declares it public (set at the door, error-handler.ts;
 * an answer's own header wins). Most answers depend on the credential, which no cache key holds by
 * default, and nginx caches an answer to a request with `Authorization` all the same: without it, one
 * agent's poll was another's for a minute behind `proxy_cache_valid 200 1m`.
 */
export const noStore = 'no-store'

type Hook = (context: { request: Request; response: unknown; set: { status?: number | string } }) => Promise<Response | undefined>

/** What a route spreads in to serve a public document: its hook, and the mark its OpenAPI description reads. */
export interface PublicDocument {
  mapResponse: Hook
  /** Read by openapi/document.ts, which documents the 200's ETag and Cache-Control and the 304. */
  detail: { [cacheControlExtension]: string }
}

export const cacheControlExtension = 'x-cache-control'

/**
 * A route's `mapResponse` hook for a public document (no credential read, the same for everyone): its
 * 200 is cacheable for `maxAgeSeconds` (0: stored, but asked again each time, `no-cache`), with an
 * `ETag` hashed from its bytes, and a GET or HEAD whose `If-None-Match` names that tag is answered 304.
 * Any other answer (a 404) keeps `no-store`. Runs after the response's schema check; the 304 carries
 * what its 200 would have of ETag, Cache-Control and, from the context, Vary and Date (RFC 9110, 15.4.5).
 * The tag is a hash of the whole body, so a document changed in any byte never gets a 304; a route whose
 * body changes on every read (a view counter in it) gains nothing from it.
 *
 * @example
 * const feed = publicDocument(60)
 * app.get('/feed.xml', () => rssResponse(xml), { mapResponse: feed.mapResponse, detail: { ...feed.detail, operationId } })
 */
export function publicDocument(maxAgeSeconds: number): PublicDocument {
  const cacheControl = maxAgeSeconds > 0 ? `public, max-age=${maxAgeSeconds}` : 'no-cache'
  return {
    detail: { [cacheControlExtension]: cacheControl },
    async mapResponse({ request, response, set }) {
      const own = response instanceof Response
      if ((own ? response.status : set.status) !== 200) return undefined
      const body = own ? await response.text() : JSON.stringify(response)
      const etag = `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"`
      const cache = { etag, 'cache-control': cacheControl }
      if (names(request.headers.get('if-none-match'), etag)) return new Response(null, { status: 304, headers: cache })
      const headers = own ? Object.fromEntries(response.headers) : { 'content-type': 'application/json;charset=utf-8' }
      return new Response(body, { headers: { ...headers, ...cache } })
    },
  }
}

/** Whether an If-None-Match value names `etag` (weak comparison, RFC 9110, 13.1.2), or is `*`. */
function names(header: string | null, etag: string): boolean {
  if (header === null) return false
  if (header.trim() === '*') return true
  for (const [, tag] of header.matchAll(/(?:W\/)?("[^"]*")/g)) if (tag === etag) return true
  return false
}
