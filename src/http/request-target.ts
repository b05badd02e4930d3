/**
 * What a request's target must be for the routes to read it as sent: its path, and the query
 * parameters its route reads, percent-encoded UTF-8 text without NUL, no fragment, each parameter
 * given once. Checked at the door, for every route, before the framework decodes anything.
 */
import { errors, type AppError } from '../errors.ts'
import { isStorableText } from '../text.ts'
import type { RouteMethods } from './route-methods.ts'

const encodingMessage = 'must be percent-encoded UTF-8 text: a % starts an escape of two hex digits (%25 for a % itself), and no %00'

/**
 * Why the request's target cannot be read as sent, or null. The framework would not refuse it: a
 * path parameter with a bad escape (`%zz`, a lone `%`, bytes not UTF-8 such as `%FF` or `%C0%AF`)
 * came to a route as U+FFFD over the wire (Bun's router, oven-sh/bun#32823) and as null in process
 * (Elysia's), and a query value kept its escape as literal text (Elysia's parse-query); of a query
 * parameter given twice, the last one counted and the others were dropped unsaid. `url` is the
 * request's absolute URL (Bun has resolved dot segments, `%2e%2e` too).
 *
 * @example
 * targetProblem('http://api/blog/feed?tag=%zz', 'GET', routes) // 400, details [{ path: '/tag', ... }]
 */
export function targetProblem(url: string, method: string, routes: RouteMethods): AppError | null {
  const start = url.indexOf('/', url.indexOf('//') + 2)
  // Bun passes a raw `#` on; no client sends a fragment, and the routes would read it as part of a value.
  if (url.indexOf('#', start) !== -1) return notValid('/', 'it must not hold a raw # (a fragment is not sent; %23 for a # itself)')
  const mark = url.indexOf('?', start)
  const path = mark === -1 ? url.slice(start) : url.slice(start, mark)
  // Most targets hold no escape at all: nothing to decode (the poll's `since` does, its colons escaped).
  if (path.includes('%') && decoded(path) === null) {
    // Named as the route names it, when one has a parameter there.
    const segment = path.split('/').findIndex(text => decoded(text) === null)
    const param = routes.paramAt(path, segment)
    return param === undefined ? notValid('/', `its path ${encodingMessage}`) : notValid(pointer(param), encodingMessage)
  }
  if (mark === -1 || mark === url.length - 1) return null
  return queryProblem(url.slice(mark + 1), () => routes.readsQuery(method, path))
}

/** The first parameter the route reads whose value is undecodable or that is given twice; the others are ignored. */
function queryProblem(query: string, read: () => ReadonlySet<string>): AppError | null {
  // The whole query decodes exactly when each name and value does: `&`, `=` and `+` are no part of an escape.
  const readable = !query.includes('%') || decoded(query) !== null
  // One parameter cannot repeat.
  if (readable && !query.includes('&')) return null
  let seen: Set<string> | undefined
  let reads: ReadonlySet<string> | undefined
  for (const pair of query.split('&')) {
    const equals = pair.indexOf('=')
    const rawName = equals === -1 ? pair : pair.slice(0, equals)
    const name = /[%+]/.test(rawName) ? decoded(rawName.replace(/\+/g, ' ')) : rawName
    // What the route does not read is ignored, as it always was: a shared link's tracking parameters.
    if (name === null || !(reads ??= read()).has(name)) continue
    if (!readable && equals !== -1 && decoded(pair.slice(equals + 1)) === null) return notValid(pointer(name), encodingMessage)
    if (seen?.has(name)) return notValid(pointer(name), 'must be given once')
    ;(seen ??= new Set()).add(name)
  }
  return null
}

const notValid = (path: string, message: string) => errors.validation('The URL is not valid', [{ path, message }])

/** The text a percent-encoded string stands for, or null when it is not UTF-8 text without NUL. */
function decoded(text: string): string | null {
  try {
    const value = decodeURIComponent(text)
    return isStorableText(value) ? value : null
  } catch {
    return null
  }
}

/** A parameter's name as a detail's pointer (RFC 6901's escapes for `~` and `/`). */
const pointer = (name: string) => `/${name.replace(/~/g, '~0').replace(/\//g, '~1')}`
