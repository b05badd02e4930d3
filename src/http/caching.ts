/**
 * What caches between the API and its callers (a proxy's `proxy_cache`, a CDN, a browser) may do with
 * its answers: keep none of them, unless a route serves a document that is the same for every caller.
 */

/**
 * Every answer's Cache-Control unless its route declares it public (set at the door, error-handler.ts;
 * an answer's own header wins). Most answers depend on the credential, which no cache key holds by
 * default, and nginx caches an answer to a request with `Authorization` all the same: without it, one
 * agent's poll was another's for a minute behind `proxy_cache_valid 200 1m`.
 */
export const noStore = 'no-store'
