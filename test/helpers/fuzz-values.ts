/** The fuzzer's values: what a client can put where a schema asks for something. */

import type { Random } from './seeded.ts'

/** A JSON Schema as the OpenAPI document has it (references resolved). */
export interface Schema {
  type?: string | string[]
  properties?: Record<string, Schema>
  required?: string[]
  additionalProperties?: boolean | Schema
  items?: Schema
  anyOf?: Schema[]
  enum?: unknown[]
  const?: unknown
  format?: string
  pattern?: string
  minLength?: number
  maxLength?: number
  minimum?: number
  maximum?: number
  maxItems?: number
  maxProperties?: number
  default?: unknown
  examples?: unknown[]
}

/** A value to send, with a label saying what it is. `raw` is JSON text spliced in where JSON.stringify cannot say it. */
export interface Variant {
  label: string
  value?: unknown
  raw?: string
}

export const types = (schema: Schema): string[] => (schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type])

/** The object a body schema describes (a body that may be null is an object or null). */
export const objectSchema = (schema: Schema | undefined): Schema | undefined =>
  schema?.anyOf ? schema.anyOf.find(s => types(s).includes('object')) : types(schema ?? {}).includes('object') ? schema : undefined

const emoji = '😀'
const nested = (depth: number): unknown => {
  let value: unknown = 'x'
  for (let i = 0; i < depth; i++) value = [value]
  return value
}

/** Strings that have broken services before: control and format characters, scripts, injections. */
export const oddStrings: Variant[] = [
  { label: 'NUL', value: 'a\u0000b' },
  { label: 'lone high surrogate', value: 'a\ud800' },
  { label: 'lone low surrogate', value: '\udc00b' },
  { label: 'RTL override', value: '\u202egnp.exe' },
  { label: 'RTL mark and isolates', value: '\u200f\u2067abc\u2069' },
  { label: 'zero-width and BOM', value: '\ufeff\u200b\u200d' },
  { label: 'combining marks', value: `e${'\u0301'.repeat(50)}` },
  { label: 'ZWJ emoji', value: '👩‍👩‍👧‍👦🏳️‍🌈' },
  { label: 'C1 controls and DEL', value: '\u0085\u009f\u007f' },
  { label: 'CR LF TAB', value: 'a\r\nb\tc' },
  { label: 'only spaces', value: '   ' },
  { label: 'non-characters', value: '\ufffe\uffff\u{10ffff}' },
  { label: 'HTML', value: '<script>alert(1)</script>' },
  { label: 'SQL', value: "' or 1=1; drop table users; --" },
  { label: 'path traversal', value: '../../../etc/passwd' },
  { label: 'percent escapes', value: '%00%2e%2e%2f' },
  { label: 'format string', value: '%s%n%x{0}${x}' },
  { label: 'very long unicode', value: 'ж'.repeat(120_000) },
  { label: 'many surrogate pairs', value: emoji.repeat(60_000) },
]

/** Paths and URLs of odd shapes, for strings that name one (a proxy call's path, a connection's base URL). */
export const urlStrings: Variant[] = [
  { label: 'protocol-relative', value: '//evil.example/x' },
  { label: 'encoded dot segments', value: '/%2e%2e/%2E%2e/x' },
  { label: 'double-encoded dot segments', value: '/%252e%252e/x' },
  { label: 'dot segments', value: '/a/../../b' },
  { label: 'matrix dot segment', value: '/..;x/y' },
  { label: 'backslashes', value: '/\\..\\x' },
  { label: 'query and fragment', value: '/a?b=c&d#e' },
  { label: 'encoded slash', value: '/repos/a%2Fb' },
  { label: 'bad percent', value: '/a%zz%' },
  { label: 'CR LF', value: '/a\r\nX-Injected: 1' },
  { label: 'unicode host', value: 'https://例え.テスト/x' },
  { label: 'user info', value: 'https://user:pass@127.0.0.1/x' },
  { label: 'IPv6 zone', value: 'https://[fe80::1%25eth0]/' },
  { label: 'port out of range', value: 'https://127.0.0.1:99999/' },
  { label: 'hex IPv4', value: 'http://0x7f.1/' },
  { label: 'file scheme', value: 'file:///etc/passwd' },
  { label: 'javascript scheme', value: 'javascript:alert(1)' },
  { label: 'no host', value: 'https:///x' },
  { label: 'only a scheme', value: 'https:' },
]

/** Markdown that costs a renderer dearly: deep quotes and lists, runs of link openers, raw HTML. */
export const markdownStrings: Variant[] = [
  { label: 'quotes 5,000 deep', value: `${'>'.repeat(5000)} x` },
  { label: 'lists 2,000 deep', value: Array.from({ length: 2000 }, (_, i) => `${'  '.repeat(i)}- x`).join('\n') },
  { label: 'link openers', value: '[a]('.repeat(20_000) },
  { label: 'HTML and entities', value: '<div>&#0;&#x110000;&unknown;<img src=x onerror=alert(1)></div>'.repeat(100) },
]

const formatStrings: Record<string, Variant[]> = {
  uuid: [
    { label: 'upper-case uuid', value: '3F2504E0-4F89-11D3-9A0C-0305E82C3301' },
    { label: 'nil uuid', value: '00000000-0000-0000-0000-000000000000' },
    { label: 'uuid without hyphens', value: '3f2504e04f8911d39a0c0305e82c3301' },
    { label: 'uuid in braces', value: '{3f2504e0-4f89-11d3-9a0c-0305e82c3301}' },
    { label: 'uuid with a space', value: ' 3f2504e0-4f89-11d3-9a0c-0305e82c3301' },
    { label: 'unknown uuid', value: 'ffffffff-ffff-4fff-bfff-ffffffffffff' },
  ],
  'date-time': [
    { label: 'February 30', value: '2026-02-30T00:00:00.000Z' },
    { label: 'year 0', value: '0000-01-01T00:00:00Z' },
    { label: 'year 9999', value: '9999-12-31T23:59:59.999Z' },
    { label: 'expanded year', value: '+275760-09-13T00:00:00.000Z' },
    { label: 'far past', value: '1000-01-01T00:00:00Z' },
    { label: 'leap second', value: '2016-12-31T23:59:60Z' },
    { label: 'odd offset', value: '2026-01-01T00:00:00+23:59' },
    { label: 'date only', value: '2026-01-01' },
    { label: 'epoch digits', value: '1767225600000' },
    { label: 'many fraction digits', value: `2026-01-01T00:00:00.${'9'.repeat(40)}Z` },
  ],
}

/** Each way a property's value can be wrong, or on its edge, for its schema (and its name: a URL's or a path's). */
export function propertyVariants(schema: Schema, name = ''): Variant[] {
  const kinds = types(schema)
  const out: Variant[] = [{ label: 'null', value: null }]
  const wrong: [string, Variant][] = [
    ['string', { label: 'a string', value: 'x' }],
    ['integer', { label: 'a number', value: 1 }],
    ['boolean', { label: 'a boolean', value: true }],
    ['object', { label: 'an object', value: { a: 1 } }],
    ['array', { label: 'an array', value: ['x'] }],
  ]
  for (const [kind, variant] of wrong) if (!kinds.includes(kind) && !(kind === 'integer' && kinds.includes('number'))) out.push(variant)
  out.push({ label: 'deeply nested', value: nested(70) }, { label: 'nested past 64 deep', raw: `${'['.repeat(10_000)}${']'.repeat(10_000)}` })
  if (kinds.includes('string')) out.push(...stringVariants(schema))
  if (kinds.includes('string') && /url|path/i.test(name)) out.push(...urlStrings)
  if (kinds.includes('string') && /content|excerpt/i.test(name)) out.push(...markdownStrings)
  if (kinds.includes('integer') || kinds.includes('number')) out.push(...numberVariants(schema))
  if (kinds.includes('boolean')) out.push({ label: 'string "true"', value: 'true' }, { label: '0', value: 0 })
  if (kinds.includes('array')) out.push(...arrayVariants(schema))
  if (kinds.includes('object')) out.push(...objectVariants(schema))
  return out
}

function stringVariants(schema: Schema): Variant[] {
  const out: Variant[] = [{ label: 'empty', value: '' }, ...oddStrings]
  const { minLength, maxLength } = schema
  if (maxLength !== undefined) {
    out.push(
      { label: 'max characters', value: 'a'.repeat(maxLength) },
      { label: 'max+1 characters', value: 'a'.repeat(maxLength + 1) },
      { label: 'max surrogate pairs', value: emoji.repeat(maxLength) },
      { label: 'max+1 surrogate pairs', value: emoji.repeat(maxLength + 1) },
      { label: 'max-1 characters and a pair', value: 'a'.repeat(Math.max(0, maxLength - 1)) + emoji },
      { label: 'max characters and a pair', value: 'a'.repeat(maxLength) + emoji },
    )
  }
  if (minLength !== undefined && minLength > 1) out.push({ label: 'min-1 characters', value: 'a'.repeat(minLength - 1) })
  if (schema.enum) {
    const first = String(schema.enum[0])
    out.push(
      { label: 'enum upper case', value: first.toUpperCase() },
      { label: 'enum with a space', value: `${first} ` },
      { label: 'not in the enum', value: 'zzz' },
    )
  }
  if (schema.format) out.push(...(formatStrings[schema.format] ?? []))
  return out
}

function numberVariants(schema: Schema): Variant[] {
  const out: Variant[] = [
    { label: '-1', value: -1 },
    { label: '2^31', value: 2 ** 31 },
    { label: '2^53+2', value: 2 ** 53 + 2 },
    { label: '1e308', value: 1e308 },
    { label: '-1e308', value: -1e308 },
    { label: '1e400 (Infinity)', raw: '1e400' },
    { label: '30 digits', raw: '123456789012345678901234567890' },
    { label: '-0', raw: '-0' },
    { label: '1.0', raw: '1.0' },
    { label: '1e-7', value: 1e-7 },
    { label: '"NaN"', value: 'NaN' },
    { label: '"Infinity"', value: 'Infinity' },
    { label: 'numeric string', value: '1' },
  ]
  if (types(schema).includes('integer')) out.push({ label: 'a float', value: 1.5 })
  if (schema.minimum !== undefined) out.push({ label: 'min', value: schema.minimum }, { label: 'min-1', value: schema.minimum - 1 })
  if (schema.maximum !== undefined) out.push({ label: 'max', value: schema.maximum }, { label: 'max+1', value: schema.maximum + 1 })
  return out
}

function arrayVariants(schema: Schema): Variant[] {
  const out: Variant[] = [
    { label: 'empty array', value: [] },
    { label: 'a huge array', value: Array.from({ length: 100_000 }, () => 'x') },
  ]
  const item = schema.items && types(schema.items).includes('string') ? 'tag' : 1
  if (schema.maxItems !== undefined) {
    out.push(
      { label: 'max items', value: Array.from({ length: schema.maxItems }, (_, i) => `${item}${i}`) },
      { label: 'max+1 items', value: Array.from({ length: schema.maxItems + 1 }, (_, i) => `${item}${i}`) },
    )
  }
  if (schema.items) for (const variant of propertyVariants(schema.items)) out.push({ label: `item ${variant.label}`, ...itemOf(variant) })
  return out
}

const itemOf = (variant: Variant): Omit<Variant, 'label'> => (variant.raw !== undefined ? { raw: `[${variant.raw}]` } : { value: [variant.value] })

function objectVariants(schema: Schema): Variant[] {
  const many = Object.fromEntries(Array.from({ length: 5000 }, (_, i) => [`k${i}`, i]))
  return [
    { label: 'empty object', value: {} },
    { label: 'many keys', value: many },
    { label: 'over 64 KiB', value: { blob: 'x'.repeat(70_000) } },
    { label: 'key with NUL', raw: '{"a\\u0000":1}' },
    { label: 'a huge array', value: { list: Array.from({ length: 100_000 }, (_, i) => i) } },
    { label: 'just under 64 KiB', value: { blob: 'x'.repeat(65_536 - 12) } },
    { label: 'just over 64 KiB', value: { blob: 'x'.repeat(65_536 - 11) } },
    { label: 'key __proto__', raw: '{"__proto__":{"polluted":1},"constructor":{"prototype":{"x":1}}}' },
    { label: 'empty key', value: { '': 1 } },
    ...(schema.maxProperties !== undefined
      ? [{ label: 'max+1 properties', value: Object.fromEntries(Array.from({ length: schema.maxProperties + 1 }, (_, i) => [`x-k${i}`, 'v'])) }]
      : []),
  ]
}

/** A random value that fits the schema, or undefined where only a known value would (a pattern, a reference). */
export function randomValid(schema: Schema, random: Random): { value: unknown } | undefined {
  if (schema.enum) return { value: random.pick(schema.enum) }
  const kinds = types(schema)
  if (kinds.includes('boolean')) return { value: random.chance(0.5) }
  if (kinds.includes('integer')) {
    const low = schema.minimum ?? 0
    const high = Math.min(schema.maximum ?? 1_000_000, low + 1_000_000_000)
    return { value: random.pick([low, high, low + random.int(high - low + 1)]) }
  }
  if (kinds.includes('string') && !schema.pattern && !schema.format) {
    const max = Math.min(schema.maxLength ?? 200, 3000)
    const min = schema.minLength ?? 0
    const length = random.pick([min, max, min + random.int(max - min + 1)])
    const alphabet = ['a', 'Z', '9', ' ', 'é', 'ж', '中', emoji, '\u202e', '\u200d', '"', '\\', '<', '\n']
    let text = Array.from({ length }, () => random.pick(alphabet)).join('')
    // Titles and tags want a visible character; a random one is kept valid by starting with one.
    if (length > 0 && /\s/.test(text[0]!)) text = `a${text.slice(1)}`
    if (length > 0 && /\s/.test(text.at(-1)!)) text = `${text.slice(0, -1)}a`
    return { value: text }
  }
  return undefined
}
