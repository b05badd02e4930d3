/** The fuzzer's requests: what it builds, how it sends them, and their bodies as sent. */
import type { App } from '../../src/app.ts'
import type { Answer } from './fuzz-oracle.ts'

/** A request as the fuzzer builds it. Path parameters and query pairs are as they go on the wire (encoded). */
export interface Spec {
  method: string
  path: string
  params: Record<string, string>
  query: [string, string][]
  headers: Record<string, string>
  /** A JSON value; undefined sends no body. */
  body?: unknown
  /** The body's text as sent, instead of `body`. */
  raw?: string
  /** JSON texts spliced into `body` where JSON.stringify cannot say them, each in place of its `splice(i)` string. */
  splices?: string[]
  /** undefined: application/json with a body; null: no Content-Type at all. */
  contentType?: string | null
  /** The body sent as a stream of unknown length (chunked on the wire), as clients that stream send it. */
  chunked?: boolean
}

/** The string standing in a body for its i-th spliced JSON text. */
export const splice = (i: number) => `\u0001splice${i}\u0001`

/** The body's text as it is sent, or undefined for none. */
export function bodyText(spec: Spec): string | undefined {
  if (spec.raw !== undefined) return spec.raw
  if (spec.body === undefined) return undefined
  let text = JSON.stringify(spec.body)
  spec.splices?.forEach((raw, i) => (text = text.replace(JSON.stringify(splice(i)), raw)))
  return text
}

/** The path as sent: the parameters' raw values in their places. */
export const pathOf = (spec: Spec) => spec.path.replace(/\{([^}]+)\}/g, (_, name: string) => spec.params[name] ?? '')

/**
 * Whether the request still goes to its operation's path: a parameter left empty, an empty segment
 * (`//`), or a dot segment the URL resolves (`..`, `%2e%2e`), makes it another path, answered by
 * another route or none.
 */
export function onRoute(spec: Spec): boolean {
  const path = pathOf(spec)
  return !Object.values(spec.params).includes('') && !path.includes('//') && resolvedPath(spec) === path
}

/** The path as a URL resolves it: dot segments (`..`, `%2e%2e`) take the segment before them away. */
export const resolvedPath = (spec: Spec) => new URL(`http://test.local${pathOf(spec)}`).pathname

/** The request of a spec, for `app.handle` (or, with the origin of a listening server, for `fetch`). */
export function toRequest(spec: Spec, origin = 'http://test.local'): Request {
  const path = pathOf(spec)
  const query = spec.query.map(([name, value]) => `${name}=${value}`).join('&')
  const headers = new Headers(spec.headers)
  // A GET or HEAD carries no body (a method mutation may have made one of a request with one).
  const body = spec.method === 'GET' || spec.method === 'HEAD' ? undefined : bodyText(spec)
  if (body !== undefined && spec.contentType !== null) headers.set('content-type', spec.contentType ?? 'application/json')
  // As on the wire: an empty body comes with its length (in process, Request leaves it out).
  if (body === '' && !spec.chunked) headers.set('content-length', '0')
  const stream = (text: string) =>
    new ReadableStream({
      start(controller) {
        if (text !== '') controller.enqueue(new TextEncoder().encode(text))
        controller.close()
      },
    })
  const sent = spec.chunked && body !== undefined ? stream(body) : body
  return new Request(`${origin}${path}${query ? `?${query}` : ''}`, { method: spec.method, headers, body: sent })
}

/**
 * Sends a spec to the app in process, or over the wire to `origin` (Bun's own parser in the way); a
 * stream's body is not read (it would never end), only its head.
 */
export async function send(app: App, spec: Spec, origin?: string): Promise<Answer> {
  const response = origin ? await fetch(toRequest(spec, origin), { redirect: 'manual' }) : await app.handle(toRequest(spec))
  if (response.headers.get('content-type')?.startsWith('text/event-stream')) {
    await response.body?.cancel()
    return { status: response.status, headers: response.headers, body: null }
  }
  const text = await response.text()
  try {
    return { status: response.status, headers: response.headers, body: JSON.parse(text) }
  } catch {
    return { status: response.status, headers: response.headers, body: text }
  }
}
