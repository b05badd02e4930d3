/** The fuzzer's mutations of a valid request: what its operation's schemas suggest, and what any request can carry. */
import type { Operation } from './fuzz-oracle.ts'
import { bodyText, splice, type Spec } from './fuzz-requests.ts'
import { objectSchema, propertyVariants, randomValid, type Schema, type Variant } from './fuzz-values.ts'
import type { Random } from './seeded.ts'

export interface Mutation {
  label: string
  /** The requests to send, in order (an Idempotency-Key reused takes two). */
  apply(spec: Spec): Spec[]
  /** What it changes: a refused write's effect on the tables is sampled for all but credentials that may be accepted. */
  where: 'body' | 'path' | 'query' | 'header' | 'credential' | 'random'
  /** A credential no operation that needs one may accept. */
  refused?: boolean
  /** The requests are sent at once rather than in turn. */
  together?: boolean
}

const clone = (spec: Spec): Spec => ({
  ...spec,
  params: { ...spec.params },
  query: spec.query.map(pair => [...pair] as [string, string]),
  headers: { ...spec.headers },
  splices: spec.splices && [...spec.splices],
  body: spec.body === undefined ? undefined : structuredClone(spec.body),
})
const one = (label: string, where: Mutation['where'], change: (spec: Spec) => void): Mutation => ({
  label,
  where,
  apply(spec) {
    const next = clone(spec)
    change(next)
    return [next]
  },
})

/** Sets a value at a path in a body, as a JSON value or as raw JSON text. */
function setAt(spec: Spec, path: string[], variant: Variant | undefined) {
  const body = (spec.body ?? {}) as Record<string, any>
  spec.body = body
  let target = body
  for (const key of path.slice(0, -1)) target = target[key] = typeof target[key] === 'object' && target[key] !== null ? target[key] : {}
  const last = path.at(-1)!
  if (variant === undefined) delete target[last]
  else if (variant.raw !== undefined) {
    spec.splices = [...(spec.splices ?? []), variant.raw]
    target[last] = splice(spec.splices.length - 1)
  } else target[last] = variant.value
}

/** Each property (and each property of a nested object) missing, and as each variant of its schema. */
export function bodyMutations(schema: Schema | undefined): Mutation[] {
  const object = objectSchema(schema)
  if (!object?.properties) return []
  const out: Mutation[] = []
  const walk = (properties: Record<string, Schema>, prefix: string[]) => {
    for (const [name, property] of Object.entries(properties)) {
      const path = [...prefix, name]
      const at = `/${path.join('/')}`
      out.push(one(`${at} missing`, 'body', spec => setAt(spec, path, undefined)))
      for (const variant of propertyVariants(property, name)) out.push(one(`${at} ${variant.label}`, 'body', spec => setAt(spec, path, variant)))
      if (property.properties && prefix.length === 0) walk(property.properties, path)
    }
  }
  walk(object.properties, [])
  const raw = (label: string, text: string) => one(label, 'body', spec => ((spec.raw = text), delete spec.body))
  out.push(
    one('an extra property', 'body', spec => setAt(spec, ['unexpectedExtra'], { label: '', value: 1 })),
    one('a constructor property', 'body', spec => setAt(spec, ['constructor'], { label: '', raw: '{"prototype":{"x":1}}' })),
    raw('body null', 'null'),
    raw('body an array', '[]'),
    raw('body a string', '"x"'),
    raw('body a number', '1'),
    raw('body empty', ''),
    raw('body whitespace', ' \n '),
    raw('body truncated JSON', '{"a":'),
    raw('body with a trailing comma', '{"a":1,}'),
    raw('body with garbage after it', '{}x'),
    raw('body with a comment', '{/* c */}'),
    raw('body single-quoted', "{'a':1}"),
    raw('body invalid UTF-8 escape', '{"a":"\\ud83d\\ude00\\u"}'),
    raw('body 200,000 deep', `${'['.repeat(200_000)}${']'.repeat(200_000)}`),
    raw('body over 2 MiB', `{"a":"${'x'.repeat(2 * 1024 * 1024 + 10)}"}`),
    one('body chunked', 'body', spec => (spec.chunked = true)),
    one('body empty, chunked', 'body', spec => ((spec.raw = ''), delete spec.body, (spec.chunked = true))),
  )
  for (const [label, change] of [
    ['body with a BOM', (text: string) => `\ufeff${text}`],
    ['body with duplicate keys', (text: string) => text.replace(/^\{/, '{"unexpectedDuplicate":1,"unexpectedDuplicate":2,')],
    ['body with a __proto__ key', (text: string) => text.replace(/^\{/, '{"__proto__":{"polluted":1},')],
  ] as const) {
    out.push(one(label, 'body', spec => (spec.raw = change(bodyText(spec) ?? '{}'))))
  }
  for (const type of [
    null,
    'text/plain',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    'application/json; charset=utf-16',
    'application/json; charset=latin1',
    'APPLICATION/JSON; Charset="UTF-8"',
    'application/json;',
    'application/json, text/plain',
    'application/vnd.api+json',
    '*/*',
    '',
  ]) {
    out.push(one(`Content-Type ${type === null ? 'none' : JSON.stringify(type)}`, 'header', spec => (spec.contentType = type)))
  }
  return out
}

/** A GET asked as HEAD: the same answer, without its body. */
export const headMutations = (operation: Operation): Mutation[] =>
  operation.method === 'GET' ? [one('as HEAD', 'header', spec => (spec.method = 'HEAD'))] : []

/** The operation's path asked with each method none of its operations takes: refused (405 naming those it does; 404 the contract allows). */
export function methodMutations(operation: Operation, operations: Operation[]): Mutation[] {
  const taken = new Set(operations.filter(other => other.path === operation.path).map(other => other.method))
  return ['GET', 'POST', 'PUT', 'PATCH', 'DELETE']
    .filter(method => !taken.has(method))
    .map(method => one(`as ${method}`, 'header', spec => (spec.method = method)))
}

/** A body sent to a route that takes none (Elysia parses JSON wherever it comes). */
export function strayBodyMutations(operation: Operation): Mutation[] {
  if (operation.requestBody || operation.method === 'GET') return []
  return [
    ['an empty JSON object', '{}'],
    ['a JSON object', '{"a":[1,{"b":null}]}'],
    ['JSON null', 'null'],
    ['broken JSON', '{"a":'],
    ['a NUL in JSON', '{"a":"\\u0000"}'],
    ['JSON 200,000 deep', `${'['.repeat(200_000)}${']'.repeat(200_000)}`],
    ['over 1 MiB', `"${'x'.repeat(1024 * 1024 + 10)}"`],
  ]
    .map(([label, text]) => one(`stray body ${label}`, 'body', spec => (spec.raw = text)))
    .concat(one('stray body empty, chunked', 'body', spec => ((spec.raw = ''), (spec.chunked = true))))
}

/** The same request sent several times at once: races between them must end in a documented answer. */
export function concurrentMutations(operation: Operation, random: Random): Mutation[] {
  const schema = operation.requestBody?.content['application/json']?.schema
  const idempotent = operation.parameters?.some(p => p.in === 'header' && p.name === 'idempotency-key')
  const out: Mutation[] = [{ label: 'twice at once', where: 'random', together: true, apply: spec => [clone(spec), clone(spec)] }]
  if (idempotent) {
    out.push({
      label: 'three at once with one Idempotency-Key',
      where: 'header',
      together: true,
      apply(spec) {
        const keyed = { ...clone(spec), headers: { ...spec.headers, 'idempotency-key': `race-${random.int(1e9)}` } }
        return [keyed, clone(keyed), positiveMutation(schema, random).apply(keyed)[0]!]
      },
    })
  }
  if (schema) {
    out.push({
      label: 'four random valid bodies at once',
      where: 'random',
      together: true,
      apply: spec => Array.from({ length: 4 }, () => positiveMutation(schema, random).apply(spec)[0]!),
    })
  }
  return out
}

/** Odd shapes of one path parameter: what a URL can carry that a route does not expect. */
export const pathShapes: [string, string][] = [
  ['empty', ''],
  ['not a UUID', 'not-a-uuid'],
  ['upper case', 'ABCDEF01-2345-4789-8BCD-EF0123456789'],
  ['encoded slash', 'a%2Fb'],
  ['dot dot', '..'],
  ['encoded dot dot', '%2e%2e'],
  ['dot', '.'],
  ['encoded NUL', '%00'],
  ['NUL inside', 'a%00b'],
  ['control character', '%01'],
  ['bad percent', '%zz'],
  ['bad percent, upper case', '%ZZ'],
  ['lone percent', '%'],
  ['trailing percent', 'abc%'],
  ['truncated escape', '%E'],
  ['truncated UTF-8', '%E0%A4%A'],
  ['encoded lone surrogate', '%ED%A0%80'],
  ['overlong UTF-8', '%C0%AF'],
  ['invalid UTF-8 byte', '%FF'],
  ['latin-1 byte', '%E9'],
  ['double-encoded slash', '%252F'],
  ['double-encoded percent', '%2525'],
  ['upper-case encoded dot dot', '%2E%2E'],
  ['unicode', '%C3%A9t%C3%A9'],
  ['Kelvin sign for a k', '%E2%84%AA'],
  ['full-width letters', '%EF%BD%81%EF%BD%82'],
  ['emoji', '%F0%9F%98%80'],
  ['RTL override', '%E2%80%AEabc'],
  ['encoded space', '%20'],
  ['plus', 'a+b'],
  ['semicolon', 'x;y=1'],
  ['at sign', '@x'],
  ['long', 'a'.repeat(5000)],
  ['over the URL limit', 'a'.repeat(9000)],
  ['long unicode', '%D0%B6'.repeat(1200)],
]

export function pathMutations(operation: Operation): Mutation[] {
  const names = (operation.parameters ?? []).filter(p => p.in === 'path').map(p => p.name)
  return [
    ...names.flatMap(name => pathShapes.map(([label, value]) => one(`path ${name} ${label}`, 'path', spec => (spec.params[name] = value)))),
    one('path with a trailing slash', 'path', spec => (spec.path = `${spec.path}/`)),
    one('path with a double slash', 'path', spec => (spec.path = spec.path.replace(/\/(?=[^/]*$)/, '//'))),
    one('path with a bad escape past its end', 'path', spec => (spec.path = `${spec.path}%zz`)),
  ]
}

const queryShapes: [string, string][] = [
  ['empty', ''],
  ['a word', 'abc'],
  ['zero', '0'],
  ['negative', '-1'],
  ['a float', '1.5'],
  ['exponent', '1e2'],
  ['huge', '9'.repeat(400)],
  ['leading space', '%201'],
  ['full-width digit', '%EF%BC%95'],
  ['encoded NUL', '%00'],
  ['control character', '%01'],
  ['encoded lone surrogate', '%ED%A0%80'],
  ['bad percent', '%zz'],
  ['lone percent', '%'],
  ['truncated escape', '1%E'],
  ['truncated UTF-8', '%E0%A4%A'],
  ['overlong UTF-8', '%C0%AF'],
  ['invalid UTF-8 byte', '%FF'],
  ['plus for a space', 'a+b'],
  ['encoded plus', '%2B1'],
  ['double-encoded', '%2531'],
  ['unicode', '%C3%A9'],
  ['long', 'a'.repeat(6000)],
  ['over the URL limit', 'a'.repeat(9000)],
  ['a date-time far away', '%2B275760-09-13T00%3A00%3A00.000Z'],
]

/** Times on the edges of what a lenient reading takes: days that do not exist, years out of range once offset. */
const timeShapes: [string, string][] = [
  ['February 30', '2026-02-30T00%3A00%3A00Z'],
  ['hour 24', '2026-01-01T24%3A00%3A00Z'],
  ['year 0', '0000-01-01T00%3A00%3A00Z'],
  ['year 1 offset into year 0', '0001-01-01T00%3A00%3A00%2B00%3A01'],
  ['year 9999 offset into year 10000', '9999-12-31T23%3A59%3A59-00%3A01'],
  ['a space for the T, no offset', '2026-01-01%2000%3A00'],
  ['offset +24:00', '2026-01-01T00%3A00%3A00%2B24%3A00'],
]

export function queryMutations(operation: Operation): Mutation[] {
  const params = (operation.parameters ?? []).filter(p => p.in === 'query')
  const out: Mutation[] = []
  const without = (spec: Spec, name: string) => (spec.query = spec.query.filter(([n]) => n !== name))
  for (const { name, schema } of params) {
    out.push(one(`query ${name} missing`, 'query', spec => without(spec, name)))
    const shapes = [...queryShapes]
    if (schema.maximum !== undefined) shapes.push(['max', String(schema.maximum)], ['max+1', String(schema.maximum + 1)])
    if (schema.minimum !== undefined) shapes.push(['min-1', String(schema.minimum - 1)])
    if (schema.enum)
      shapes.push(['enum upper case', encodeURIComponent(String(schema.enum[0]).toUpperCase())], ['enum with a space', `${schema.enum[0]}%20`])
    if (schema.format === 'uuid')
      shapes.push(['upper-case uuid', '3F2504E0-4F89-11D3-9A0C-0305E82C3301'], ['uuid without hyphens', '3f2504e04f8911d39a0c0305e82c3301'])
    if (schema.format === 'date-time') shapes.push(...timeShapes)
    for (const [label, value] of shapes)
      out.push(one(`query ${name} ${label}`, 'query', spec => (without(spec, name), spec.query.push([name, value]))))
    out.push(
      one(`query ${name} repeated`, 'query', spec => spec.query.push(...spec.query.filter(([n]) => n === name), [name, '1'])),
      one(`query ${name} repeated, its name escaped`, 'query', spec => spec.query.push([escapeAll(name), '1'], [name, '1'])),
      one(`query ${name}[]`, 'query', spec => (without(spec, name), spec.query.push([`${name}[]`, '1']))),
      one(`query ${name}[a]`, 'query', spec => (without(spec, name), spec.query.push([`${name}[a]`, '1']))),
    )
  }
  out.push(
    one('query unknown parameter', 'query', spec => spec.query.push(['__proto__', 'x'], ['constructor', 'y'])),
    one('query 1,000 parameters', 'query', spec => spec.query.push(...Array.from({ length: 1000 }, (_, i): [string, string] => [`p${i % 7}`, 'v']))),
    one('query odd names', 'query', spec => spec.query.push(['%00', '1'], ['%ED%A0%80', '2'], ['', '3'], ['a'.repeat(3000), '4'])),
    one('query a name with a bad escape', 'query', spec => spec.query.push(['%zz', '1'])),
    one('query unknown parameter with a bad escape', 'query', spec => spec.query.push(['utm_source', '%'])),
    one('query unknown parameter repeated', 'query', spec => spec.query.push(['utm_source', 'a'], ['utm_source', 'b'])),
  )
  return out
}

/** Every character of a name percent-encoded: the same name to a decoder, another to a string compare. */
const escapeAll = (name: string) => [...new TextEncoder().encode(name)].map(byte => `%${byte.toString(16).toUpperCase().padStart(2, '0')}`).join('')

/** Idempotency-Key where the operation documents it; a stream's resume header where it takes one. */
export function headerMutations(operation: Operation, random: Random): Mutation[] {
  const out: Mutation[] = []
  const header = (label: string, name: string, value: string) => one(`${name} ${label}`, 'header', spec => (spec.headers[name] = value))
  if (operation.parameters?.some(p => p.in === 'header' && p.name === 'idempotency-key')) {
    for (const [label, value] of [
      ['empty', ''],
      ['a space', ' '],
      ['255 characters', 'k'.repeat(255)],
      ['256 characters', 'k'.repeat(256)],
      ['8000 characters', 'k'.repeat(8000)],
      ['latin-1', 'cl\u00e9-\u00ff'],
      ['tab inside', 'a\tb'],
      ['a comma list', 'a, b'],
    ] as const) {
      out.push(header(label, 'idempotency-key', value))
    }
    out.push({
      label: 'idempotency-key reused, then with another body',
      where: 'header',
      apply(spec) {
        const key = `reuse-${random.int(1e9)}`
        const first = { ...clone(spec), headers: { ...spec.headers, 'idempotency-key': key } }
        const other = positiveMutation(operation.requestBody?.content['application/json']?.schema, random).apply(first)[0]!
        return [first, clone(first), other]
      },
    })
  }
  if (operation.path.startsWith('/v1/events/')) {
    for (const [label, value] of [
      ['not an id', 'abc'],
      ['far future', '99999999999999-0'],
      ['huge sequence', `1-${'9'.repeat(40)}`],
      ['negative', '-1-0'],
      ['empty', ''],
    ] as const) {
      out.push(header(label, 'last-event-id', value))
    }
  }
  for (const [name, value] of [
    ['if-none-match', '*'],
    ['if-match', '"x"'],
    ['if-modified-since', 'garbage'],
    ['range', 'bytes=0-0'],
    ['accept', 'application/xml'],
    ['accept-encoding', 'gzip;q=x'],
    ['x-forwarded-for', '::1, not-an-address, 999.1.1.1'],
    ['content-encoding', 'gzip'],
    ['x-http-method-override', 'DELETE'],
    ['transfer-encoding', 'chunked'],
    ['expect', '100-continue'],
  ] as const) {
    out.push(header('odd', name, value))
  }
  return out
}

/** A request body of random valid values, where a property's schema allows them to be made up. */
export function positiveMutation(schema: Schema | undefined, random: Random): Mutation {
  return one('random valid values', 'random', spec => {
    const object = objectSchema(schema)
    if (!object?.properties || typeof spec.body !== 'object' || spec.body === null) return
    for (const [name, property] of Object.entries(object.properties)) {
      const optional = !object.required?.includes(name)
      if (optional && random.chance(0.2)) setAt(spec, [name], undefined)
      else {
        const made = randomValid(property, random)
        if (made && random.chance(0.7)) setAt(spec, [name], { label: '', value: made.value })
      }
    }
  })
}

/** Several mutations of different places at once: what a single-change run never sends. */
export function combined(mutations: Mutation[], random: Random): Mutation {
  const picked = Array.from({ length: 2 + random.int(3) }, () => random.pick(mutations))
  return {
    label: picked.map(m => m.label).join(' + '),
    where: 'random',
    apply: spec => [picked.reduce((current, mutation) => mutation.apply(current).at(-1)!, spec)],
  }
}
