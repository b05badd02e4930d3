/** Which methods each path takes: the 405's Allow header, answers to OPTIONS, and what a body is checked for. */

export interface Route {
  method: string
  path: string
}

export interface RouteMethods {
  /** Learns the app's routes; called once they are all registered. */
  index(routes: readonly Route[]): void
  /** The methods a path takes (HEAD wherever GET is, and OPTIONS), or null when no route has the path. */
  allowed(path: string): string[] | null
  /** Whether some route takes this method on this path. */
  takes(method: string, path: string): boolean
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
  let patterns: { pattern: RegExp; methods: Set<string> }[] = []
  const methodsOf = (path: string): Set<string> | null => {
    const trimmed = path.length > 1 && path.endsWith('/') ? path.slice(0, -1) : path
    let found: Set<string> | null = null
    for (const { pattern, methods } of patterns) {
      if (!pattern.test(trimmed)) continue
      found ??= new Set()
      for (const method of methods) found.add(method)
    }
    return found
  }
  return {
    index(routes) {
      const byPath = new Map<string, Set<string>>()
      for (const { method, path } of routes) {
        const methods = byPath.get(path) ?? new Set<string>()
        methods.add(method)
        if (method === 'GET') methods.add('HEAD')
        byPath.set(path, methods)
      }
      patterns = [...byPath].map(([path, methods]) => ({ pattern: toPattern(path), methods }))
    },
    allowed(path) {
      const methods = methodsOf(path)
      return methods ? [...methods, 'OPTIONS'].sort() : null
    },
    takes(method, path) {
      return methodsOf(path)?.has(method) ?? false
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
