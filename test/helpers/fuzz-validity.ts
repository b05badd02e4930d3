/** Whether the OpenAPI document calls a request invalid: then no answer to it may be a success. */
import type { documentOracle, Operation } from './fuzz-oracle.ts'
import { bodyText, resolvedPath, type Spec } from './fuzz-requests.ts'
import { objectSchema } from './fuzz-values.ts'

const jsonType = /^application\/json\s*(;\s*charset\s*=\s*"?utf-?8"?\s*)?;?$/i

/**
 * Why the document refuses the request: its body (not JSON, not of the schema, missing), a path
 * parameter, a documented header or a query parameter not of its schema (a query integer out of its
 * range). Query times are left out: the service reads them leniently on purpose (a space for the T,
 * no offset).
 */
export function requestProblems(oracle: ReturnType<typeof documentOracle>, op: Operation, spec: Spec): string[] {
  const problems: string[] = []
  const body = op.requestBody
  const text = bodyText(spec)
  if (body && (text === undefined || text === '')) {
    if (body.required) problems.push('no body')
  } else if (body && text !== undefined) {
    if (spec.contentType !== undefined && (spec.contentType === null || !jsonType.test(spec.contentType))) problems.push('not sent as JSON')
    let parsed: unknown
    try {
      // RFC 8259, 8.1: a parser may ignore a byte order mark.
      parsed = JSON.parse(text.replace(/^\ufeff/, ''))
      problems.push(...oracle.errorsOf(body.content['application/json']!.schema, parsed).map(e => `body ${e}`))
    } catch {
      problems.push('body not JSON')
    }
    // JSON.parse keeps a "__proto__" key as a property; a schema of known properties refuses it.
    if (parsed && typeof parsed === 'object' && Object.hasOwn(parsed, '__proto__') && objectSchema(body.content['application/json']!.schema)) {
      problems.push('body has a __proto__ property')
    }
  }
  problems.push(...doorProblems(op, spec, true))
  for (const parameter of op.parameters ?? []) {
    const value = valueOf(spec, parameter.in, parameter.name)
    // Undecodable or repeated: a door problem, told above.
    if (value === null || value === false) continue
    if (value === undefined) {
      if (parameter.required) problems.push(`${parameter.in} ${parameter.name} missing`)
      continue
    }
    if (parameter.in === 'query' && parameter.schema.type === 'integer') {
      const { minimum = -Infinity, maximum = Infinity } = parameter.schema
      if (!/^\d+$/.test(value) || Number(value) < minimum || Number(value) > maximum) problems.push(`query ${parameter.name} out of range`)
    } else if (parameter.in !== 'query' || parameter.schema.format !== 'date-time') {
      problems.push(...oracle.errorsOf(parameter.schema, value).map(e => `${parameter.in} ${parameter.name} ${e}`))
    }
  }
  return problems
}

/**
 * Why the service must refuse the request at the door, whatever its route: a 400 (src/http/request-target.ts,
 * the document's 400 `BadRequest`), unless a limit answers first (414, 431). A path segment (once dot
 * segments are resolved) that is not percent-encoded UTF-8 text without NUL; on its route, a query
 * parameter of the operation whose value is not, or that is given twice.
 */
export function doorProblems(op: Operation, spec: Spec, routed: boolean): string[] {
  const problems: string[] = []
  // The path as it arrives: a dot segment after a segment that is not text takes that segment away.
  if (
    resolvedPath(spec)
      .split('/')
      .some(segment => text(segment) === null)
  )
    problems.push('path not decodable')
  // Of the query, only the operation's parameters: the others are ignored, whatever they hold.
  const reads = new Set(((routed && op.parameters) || []).filter(parameter => parameter.in === 'query').map(parameter => parameter.name))
  const counts = new Map<string, number>()
  for (const [rawName, raw] of spec.query) {
    const name = text(rawName.replace(/\+/g, ' '))
    if (name === null || !reads.has(name)) continue
    if (text(raw) === null) problems.push(`query ${name} not decodable`)
    counts.set(name, (counts.get(name) ?? 0) + 1)
  }
  for (const [name, count] of counts) if (count > 1) problems.push(`query ${name} given twice`)
  return problems
}

/** The text a percent-encoded string stands for; null when it is not UTF-8 text without NUL. */
function text(raw: string): string | null {
  try {
    const value = decodeURIComponent(raw)
    return value.includes('\u0000') ? null : value
  } catch {
    return null
  }
}

/**
 * A parameter's value as the service reads it: decoded; undefined when absent, false when repeated,
 * null when undecodable.
 */
function valueOf(spec: Spec, where: string, name: string): string | undefined | null | false {
  const decode = (raw: string) => text(where === 'query' ? raw.replace(/\+/g, ' ') : raw)
  if (where === 'path') return spec.params[name] === undefined ? undefined : decode(spec.params[name])
  // A header's value arrives without the spaces and tabs around it (Fetch and HTTP drop them).
  if (where === 'header') return spec.headers[name]?.replace(/^[\t ]+|[\t ]+$/g, '')
  const values = spec.query.filter(([n]) => text(n.replace(/\+/g, ' ')) === name)
  return values.length === 0 ? undefined : values.length === 1 ? decode(values[0]![1]) : false
}
