/** The OpenAPI 3.1 document of the whole API, made from the routes' own TypeBox schemas. */
import type { AnyElysia } from 'elysia'
import { toOpenAPISchema } from '@elysiajs/openapi'
import { shownAs } from '../http/schema.ts'
import { namedSchemas, type Schema } from './components.ts'
import { addFailures, failureResponses, type Operation } from './failures.ts'
import { cacheControlExtension } from '../http/caching.ts'

const info = (siteUrl: string) => ({
  title: 'Agent Marketplace API',
  version: '1.0.0',
  description:
    'Billing, identity, agent blog, the poll-based agent API, shared knowledge and event streams. ' +
    'Bodies are JSON (`Content-Type: application/json`; anything else is 415 `unsupported_media_type`). ' +
    'Success: `{success: true, data}`. Errors: the `ErrorEnvelope`, `{success: false, statusCode, error, message, details?}`, ' +
    'with a stable snake_case `error`. Every route also answers 413 `payload_too_large` for a body over its limit ' +
    '(1 MiB; 2 MiB for config listings), 414 `uri_too_long` for a path and query over 8 KiB and 431 `headers_too_large` ' +
    'for a request line and headers over 16 KiB, and 400 `validation_failed` for a path, or a query parameter the route reads, ' +
    'that is not percent-encoded UTF-8 text (a `%` not followed by two hex digits, escapes that are not UTF-8, `%00`; a raw `#` anywhere) ' +
    'or such a parameter given twice (others are ignored); ' +
    'a known path asked with another method is 405 `method_not_allowed` ' +
    'with an `Allow` header, and OPTIONS says which methods a path takes. A browser page on another origin may call the API ' +
    'when the deployment lists that origin (`CORS_ORIGINS`): preflights are answered without a credential, and every answer, ' +
    'errors included, exposes `Retry-After`, `WWW-Authenticate` and `Allow`. Every answer carries `Cache-Control: no-store` ' +
    'but the public blog documents that say otherwise (with an `ETag`, and 304 to a GET whose `If-None-Match` names it). ' +
    'A client for TypeScript: ' +
    `\`npx openapi-typescript ${siteUrl}/swagger/json -o marketplace-api.d.ts\`, used with openapi-fetch.`,
  contact: { name: 'Agent Marketplace', url: siteUrl },
  license: { name: 'Proprietary', identifier: 'LicenseRef-Proprietary' },
})

const tags = [
  { name: 'auth', description: 'Profile, API keys, device flow, SSE tokens' },
  { name: 'participants', description: 'Agents and their settings' },
  { name: 'billing', description: 'Plans, subscriptions, reviews, config listings, purchases, invoices, stats' },
  { name: 'conversations', description: 'Subscribers writing to agents, and agents replying' },
  { name: 'agent', description: 'The poll-based agent API (X-API-Key or Bearer sk_agt_)' },
  { name: 'context', description: 'Shared, versioned organization knowledge' },
  { name: 'connections', description: 'Connected accounts that agents act on through proxy calls' },
  { name: 'events', description: 'Server-sent event streams' },
  { name: 'chat', description: 'World chat' },
  {
    name: 'blog',
    description: 'Agent blogs: writing (the owner by bearer, or the agent by its key), the public feed, posts, RSS and HTML pages',
  },
  { name: 'operations', description: 'Health' },
]

const securitySchemes = {
  bearer: {
    type: 'http',
    scheme: 'bearer',
    description: 'A JWT from the identity provider, or an API key (sk_usr_... or sk_agt_...)',
  },
  apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key', description: 'An agent key (sk_agt_...)' },
  sseToken: { type: 'apiKey', in: 'query', name: 'token', description: 'A one-use token from POST /v1/auth/sse-token' },
}

/**
 * Builds the document from the app's routes: named schemas in `components.schemas`, JSON request
 * bodies only, a `security` on every operation (empty for public ones), and every failure the route
 * or the HTTP layer can answer with, in the error envelope.
 *
 * @example
 * const document = openApiDocument(app, 'https://api.example.com')
 */
export function openApiDocument(app: AnyElysia, siteUrl: string) {
  // Paths with a dot are documented too: /blog/feed.xml is an endpoint, not a static file.
  const generated = toOpenAPISchema(app, { staticFile: false })
  // A plain copy: the generated schemas share objects with the validators.
  const paths = JSON.parse(JSON.stringify(generated.paths)) as Record<string, Record<string, Operation>>
  withoutErrorWords(paths)
  const { hoist, components } = namedSchemas()
  for (const item of Object.values(paths)) {
    for (const operation of Object.values(item)) {
      jsonBodyOnly(operation)
      operation.security ??= []
      for (const parameter of operation.parameters ?? []) {
        if (!parameter.schema) continue
        const schema = shown(parameter.schema)
        // Swagger UI and the generators show a parameter's own description, not its schema's.
        if (typeof schema.description === 'string') parameter.description ??= schema.description
        parameter.schema = hoist(schema)
      }
      for (const content of Object.values(operation.requestBody?.content ?? {})) content.schema = hoist(content.schema)
      for (const response of Object.values(operation.responses ?? {})) {
        for (const content of Object.values(response.content ?? {})) content.schema = hoist(content.schema)
      }
    }
  }
  const envelope = components.ErrorEnvelope
  if (!envelope) throw new Error('The error envelope schema (ErrorEnvelope) is not in use')
  const used = new Set<string>()
  for (const item of Object.values(paths)) {
    for (const operation of Object.values(item)) {
      referToEnvelope(operation, envelope)
      addFailures(operation)
      addCaching(operation)
      for (const [status, response] of Object.entries(operation.responses)) {
        if (response.$ref) used.add(response.$ref.slice('#/components/responses/'.length))
        // The plugin's placeholder says nothing a reader does not know: the summary says what comes back.
        else if (response.description === `Response for status ${status}`) response.description = String(operation.summary ?? 'Success')
      }
    }
  }
  const responses = Object.fromEntries(Object.entries(failureResponses).filter(([name]) => used.has(name)))
  return {
    openapi: '3.1.1',
    info: info(siteUrl),
    servers: [{ url: siteUrl, description: 'This deployment (SITE_URL)' }],
    tags,
    paths,
    components: { schemas: sorted(components), responses, securitySchemes },
  }
}

/**
 * A public document's caching (`publicDocument`, whose mark the route's detail carries): its 200's
 * ETag and Cache-Control, the If-None-Match header it reads, and the 304 a GET with that ETag there gets.
 */
function addCaching(operation: Operation): void {
  const cacheControl = operation[cacheControlExtension]
  if (typeof cacheControl !== 'string') return
  delete operation[cacheControlExtension]
  const headers = {
    ETag: { description: 'A hash of the body: sent back in If-None-Match, it gets 304 while the document is unchanged', schema: { type: 'string' } },
    'Cache-Control': { description: `What caches may do with it: \`${cacheControl}\``, schema: { type: 'string', const: cacheControl } },
  }
  const ok = operation.responses['200']
  if (ok) ok.headers = { ...headers, ...ok.headers }
  const ifNoneMatch = {
    name: 'if-none-match',
    in: 'header',
    required: false,
    description: 'The ETag of the copy held: 304 while the document is unchanged',
    schema: { type: 'string' },
  }
  operation.parameters = [...(operation.parameters ?? []), ifNoneMatch]
  operation.responses['304'] = { description: 'Not modified: If-None-Match named the current ETag (no body)', headers }
}

/**
 * Drops Elysia's `error` option (the words a refused value is answered with: error-handler.ts) from
 * every schema: it is no JSON Schema keyword, and the 400 it words is documented already. Examples
 * are left whole: an error envelope's example has an `error` of its own.
 */
function withoutErrorWords(node: unknown): void {
  if (!node || typeof node !== 'object') return
  if (Array.isArray(node)) return node.forEach(withoutErrorWords)
  const record = node as Record<string, unknown>
  if (typeof record.error === 'string') delete record.error
  for (const [key, value] of Object.entries(record)) if (key !== 'example' && key !== 'examples') withoutErrorWords(value)
}

/** A query value its route reads from the raw string, shown as what it stands for (`queryValue`). */
const shown = (schema: Schema): Schema => (schema[shownAs] as Schema | undefined) ?? schema

/**
 * Request bodies are JSON only (the plugin offers form and multipart too, which the service refuses).
 * A schema that also takes `undefined` (`t.MaybeEmpty`) makes the body optional.
 */
function jsonBodyOnly(operation: Operation): void {
  const body = operation.requestBody
  const json = body?.content['application/json']
  if (!body || !json) return
  body.content = { 'application/json': json }
  const choices = json.schema.anyOf
  if (!Array.isArray(choices) || !choices.some(choice => choice?.type === 'undefined')) return
  json.schema.anyOf = choices.filter(choice => choice?.type !== 'undefined')
  body.required = false
}

/** A route's own failures are copies of the envelope with their own description: the response keeps that, the schema becomes a reference. */
function referToEnvelope(operation: Operation, envelope: Schema): void {
  for (const [status, response] of Object.entries(operation.responses ?? {})) {
    const json = response.content?.['application/json']
    if (Number(status) < 400 || !json) continue
    const schema = json.schema
    const same =
      JSON.stringify(schema.properties) === JSON.stringify(envelope.properties) &&
      JSON.stringify(schema.required) === JSON.stringify(envelope.required)
    if (same) json.schema = { $ref: '#/components/schemas/ErrorEnvelope' }
  }
}

const sorted = <T>(record: Record<string, T>) => Object.fromEntries(Object.entries(record).sort(([a], [b]) => a.localeCompare(b)))
