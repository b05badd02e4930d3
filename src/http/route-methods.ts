/**
 * Which methods each path takes: the 405's Allow header, answers to OPTIONS, which routes take a body
 * and which query parameters they read.
 */

export interface Route {
  method: string
  path: string
  /** The route's schemas; one with a `body` schema takes a body, and reads the properties of its `query` schema. */
  hooks?: { body?: unknown; query?: unknown }
}

export interface RouteMethods {
  /** Learns the app's routes; called once they are all registered. */
  index(routes: readonly Route[]): void
  /** The methods a path takes (HEAD wherever GET is, and OPTIONS), or null when no route has the path. */
  allowed(path: string): string[] | null
  /** Whether the route for this method and path takes a body. */
  takesBody(method: string, path: string): boolean
  /** The query parameters the route for this method (HEAD: GET's) and path reads; empty for none. */
  readsQuery(method: string, path: string): ReadonlySet<string>
  /** The name of the path parameter a route reads from the path's `index`th segment (split at `/`), if any. */
  paramAt(path: string, index: number): string | undefined
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
  let patterns: ({ pattern: RegExp; params: (string | undefined)[] } & Entry)[] = []
  const namesOf = (path: string, which: 'methods' | 'bodies' | 'queries', method?: string): Set<string> | null => {
    const trimmed = withoutTrailingSlash(path)
    let found: Set<string> | null = null
    for (const entry of patterns) {
      if (!entry.pattern.test(trimmed)) continue
      found ??= new Set()
      for (const name of which === 'queries' ? (entry.queries.get(method!) ?? []) : entry[which]) found.add(name)
    }
    return found
  }
  return {
    index(routes) {
      const byPath = new Map<string, Entry>()
      for (const { method, path, hooks } of routes) {
        const entry = byPath.get(path) ?? { methods: new Set<string>(), bodies: new Set<string>(), queries: new Map() }
        entry.methods.add(method)
        if (method === 'GET') entry.methods.add('HEAD')
        if (hooks?.body) entry.bodies.add(method)
        const properties = (hooks?.query as { properties?: object } | undefined)?.properties
        if (properties) entry.queries.set(method, new Set(Object.keys(properties)))
        byPath.set(path, entry)
      }
      patterns = [...byPath].map(([path, entry]) => ({
        pattern: toPattern(path),
        params: path.split('/').map(segment => (segment.includes(':') ? segment.slice(segment.indexOf(':') + 1) : undefined)),
        ...entry,
      }))
    },
    allowed(path) {
      const methods = namesOf(path, 'methods')
      return methods ? [...methods, 'OPTIONS'].sort() : null
    },
    takesBody(method, path) {
      return namesOf(path, 'bodies')?.has(method) ?? false
    },
    readsQuery(method, path) {
      return namesOf(path, 'queries', method === 'HEAD' ? 'GET' : method) ?? new Set()
    },
    paramAt(path, index) {
      const trimmed = withoutTrailingSlash(path)
      return patterns.find(entry => entry.params[index] !== undefined && entry.pattern.test(trimmed))?.params[index]
    },
  }
}

interface Entry {
  methods: Set<string>
  bodies: Set<string>
  /** The query parameters each method's route reads. */
  queries: Map<string, Set<string>>
}

const withoutTrailingSlash = (path: string) => (path.length > 1 && path.endsWith('/') ? path.slice(0, -1) : path)

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
