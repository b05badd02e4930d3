/** Which methods each path takes: the 405's Allow header, answers to OPTIONS, and which routes take a body. */

export interface Route {
  method: string
  path: string
  /** The route's schemas; one with a `body` schema takes a body. */
  hooks?: { body?: unknown }
}

export interface RouteMethods {
  /** Learns the app's routes; called once they are all registered. */
  index(routes: readonly Route[]): void
  /** The methods a path takes (HEAD wherever GET is, and OPTIONS), or null when no route has the path. */
  allowed(path: string): string[] | null
  /** Whether the route for this method and path takes a body. */
  takesBody(method: string, path: string): boolean
}

/**
 * A route's path as Elysia writes it (`/v1/participants/:id`, `/@:name/blog`): a parameter is one
 * non-empty segment, or the rest of one after a literal prefix. Elysia also matches a trailing slash.
 *
 * @example
 * const routes = routeMethods()
 * routes.index(app.routes)
 * routes.allowed('/v1/participants/0b4c...') // ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH']
 */
export function routeMethods(): RouteMethods {
  let patterns: { pattern: RegExp; methods: Set<string>; bodies: Set<string> }[] = []
  const methodsOf = (path: string, which: 'methods' | 'bodies'): Set<string> | null => {
    const trimmed = path.length > 1 && path.endsWith('/') ? path.slice(0, -1) : path
    let found: Set<string> | null = null
    for (const entry of patterns) {
      if (!entry.pattern.test(trimmed)) continue
      found ??= new Set()
      for (const method of entry[which]) found.add(method)
    }
    return found
  }
  return {
    index(routes) {
      const byPath = new Map<string, { methods: Set<string>; bodies: Set<string> }>()
      for (const { method, path, hooks } of routes) {
        const entry = byPath.get(path) ?? { methods: new Set<string>(), bodies: new Set<string>() }
        entry.methods.add(method)
        if (method === 'GET') entry.methods.add('HEAD')
        if (hooks?.body) entry.bodies.add(method)
        byPath.set(path, entry)
      }
      patterns = [...byPath].map(([path, entry]) => ({ pattern: toPattern(path), ...entry }))
    },
    allowed(path) {
      const methods = methodsOf(path, 'methods')
      return methods ? [...methods, 'OPTIONS'].sort() : null
    },
    takesBody(method, path) {
      return methodsOf(path, 'bodies')?.has(method) ?? false
    },
  }
}

function toPattern(path: string): RegExp {
  const source = path
    .split('/')
    .map(segment => {
      const param = segment.indexOf(':')
      const literal = escape(param === -1 ? segment : segment.slice(0, param))
      return param === -1 ? literal : `${literal}[^/]+`
    })
    .join('/')
  return new RegExp(`^${source}$`)
}

const escape = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
