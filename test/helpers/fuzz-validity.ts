/** Whether the OpenAPI document calls a request invalid: then no answer to it may be a success. */
import type { documentOracle, Operation } from './fuzz-oracle.ts'
import { bodyText, type Spec } from './fuzz-requests.ts'
import { objectSchema } from './fuzz-values.ts'

const jsonType = /^application\/json\s*(;\s*charset\s*=\s*"?utf-?8"?\s*)?;?$/i

/**
 * Why the document refuses the request: its body (not JSON, not of the schema, missing), a path
 * parameter or a documented header not of its schema, or a query integer out of its range. Query
 * times are left out: the service reads them leniently on purpose (a space for the T, no offset).
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
  for (const parameter of op.parameters ?? []) {
    const value = valueOf(spec, parameter.in, parameter.name)
    // Repeated: which one counts is the framework's to say, not the document's.
    if (value === false) continue
    if (value === undefined) {
      if (parameter.required) problems.push(`${parameter.in} ${parameter.name} missing`)
      continue
    }
    if (value === null) {
      problems.push(`${parameter.in} ${parameter.name} not decodable`)
      continue
    }
    if (parameter.in === 'query' && parameter.schema.type === 'integer') {
      const { minimum = -Infinity, maximum = Infinity } = parameter.schema
      if (!/^\d+$/.test(value) || Number(value) < minimum || Number(value) > maximum) problems.push(`query ${parameter.name} out of range`)
    } else if (parameter.in !== 'query') {
      problems.push(...oracle.errorsOf(parameter.schema, value).map(e => `${parameter.in} ${parameter.name} ${e}`))
    }
  }
  return problems
}

/**
 * A parameter's value as the service reads it: decoded; undefined when absent, false when repeated.
 * Undecodable (a bad percent escape, or bytes not UTF-8), a path parameter is null and a query value
 * is kept as it was sent, as Elysia reads them.
 */
function valueOf(spec: Spec, where: string, name: string): string | undefined | null | false {
  const decode = (raw: string) => {
    try {
      return decodeURIComponent(raw.replace(/\+/g, where === 'query' ? ' ' : '+'))
    } catch {
      return where === 'query' ? raw : null
    }
  }
  if (where === 'path') return spec.params[name] === undefined ? undefined : decode(spec.params[name]!)
  if (where === 'header') return spec.headers[name]
  const values = spec.query.filter(([n]) => n === name)
  return values.length === 0 ? undefined : values.length === 1 ? decode(values[0]![1]) : false
}
