/** The OpenAPI document as generators read it: unique paths, named schemas, JSON bodies, security, and every failure a route answers. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import SwaggerParser from '@apidevtools/swagger-parser'
import { createAgent, createTestContext, signUp, type CallResult, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'

let ctx: TestContext
let user: TestUser
let agent: TestAgent
// The document as served, and with its references resolved.
let doc: any
let resolved: any

beforeAll(async () => {
  ctx = await createTestContext()
  user = await signUp(ctx)
  agent = await createAgent(ctx, user)
  doc = (await ctx.call('GET', '/swagger/json')).body
  resolved = await SwaggerParser.dereference(structuredClone(doc))
})
afterAll(() => ctx.close())

const methods = ['get', 'put', 'post', 'patch', 'delete']
const operations = (document: any) =>
  Object.entries<Record<string, any>>(document.paths).flatMap(([path, item]) =>
    Object.entries<any>(item)
      .filter(([method]) => methods.includes(method))
      .map(([method, operation]) => ({ path, method, operation, where: `${method.toUpperCase()} ${path}` })),
  )

/** The operation's path with a sample value for each path parameter (a random UUID where it takes one). */
const sampleUrl = (path: string, operation: any): string =>
  path.replace(/\{([^}]+)\}/g, (_, name: string) => {
    const parameter = operation.parameters.find((p: any) => p.in === 'path' && p.name === name)
    if (parameter.schema.format === 'uuid') return crypto.randomUUID()
    return parameter.schema.enum?.[0] ?? (name === 'code' ? 'BCDF-GHJK' : 'sample')
  })

describe('paths', () => {
  test('no two paths differ only by the names of their parameters', () => {
    const shapes = new Map<string, string>()
    for (const path of Object.keys(doc.paths)) {
      const shape = path.replace(/\{[^}]+\}/g, '{}')
      expect(shapes.get(shape), `${path} and ${shapes.get(shape)}`).toBeUndefined()
      shapes.set(shape, path)
    }
    expect(doc.paths['/v1/participants/{id}']).toContainAllKeys(['get', 'patch', 'delete'])
    expect(doc.paths['/v1/auth/device-codes/{code}']).toContainAllKeys(['get', 'patch'])
  })
})

describe('named schemas', () => {
  const resources = [
    'ErrorEnvelope',
    'ErrorDetail',
    'UserProfile',
    'ApiKey',
    'DeviceAuthorization',
    'DevicePoll',
    'SseToken',
    'Participant',
    'ParticipantSettings',
    'Plan',
    'Subscription',
    'Review',
    'ConfigListing',
    'Purchase',
    'PurchasedConfig',
    'CreatorStats',
    'Invoice',
    'Message',
    'Reply',
    'AgentEvents',
    'AgentStatus',
    'ServiceRequest',
    'ProxyResult',
    'ContextEntry',
    'Connection',
    'ChatMessage',
    'Post',
    'PostSummary',
    'ReactionCounts',
    'Health',
  ]

  test('every resource and the error envelope is a described component, with examples where a reader wants one', () => {
    const schemas = doc.components.schemas
    for (const name of resources) expect(schemas[name], name).toBeObject()
    for (const [name, schema] of Object.entries<any>(schemas)) {
      expect(typeof schema.description, name).toBe('string')
      expect(schema.$id, name).toBeUndefined()
    }
    for (const name of ['ErrorEnvelope', 'Participant', 'Plan', 'Subscription', 'Invoice', 'Message', 'Post', 'AgentEvents']) {
      expect(schemas[name].examples?.length, name).toBeGreaterThan(0)
    }
  })

  test('operations refer to the components rather than repeating them', () => {
    const data = (path: string, method: string, status: string) =>
      doc.paths[path][method].responses[status].content['application/json'].schema.properties.data
    expect(data('/v1/billing/plans', 'post', '201')).toEqual({ $ref: '#/components/schemas/Plan' })
    expect(data('/v1/billing/invoices', 'get', '200').items).toEqual({ $ref: '#/components/schemas/Invoice' })
    expect(data('/v1/billing/subscriptions', 'post', '201')).toEqual({ $ref: '#/components/schemas/Subscription' })
    expect(doc.paths['/v1/billing/plans'].post.requestBody.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/CreatePlan' })
    // Every error a route declares is the envelope, by reference.
    for (const { where, operation } of operations(doc)) {
      for (const [status, response] of Object.entries<any>(operation.responses)) {
        if (Number(status) < 400 || response.$ref) continue
        const schema = response.content?.['application/json']?.schema
        if (schema)
          expect(schema, `${where} ${status}`).toEqual(expect.objectContaining({ $ref: expect.stringMatching(/\/(ErrorEnvelope|Health)$/) }))
      }
    }
  })
})

describe('types as generators read them', () => {
  test('maps are objects with additionalProperties (patternProperties gives generators no value type)', () => {
    expect(JSON.stringify(doc)).not.toContain('patternProperties')
    const proxy = doc.components.schemas.ProxyCall.properties
    expect(proxy.headers.additionalProperties).toMatchObject({ type: 'string', maxLength: 4096 })
    expect(proxy.query.additionalProperties.anyOf.map((s: { type: string }) => s.type)).toEqual(['string', 'number', 'boolean'])
    expect(doc.components.schemas.ContextEntry.properties.data.additionalProperties).toBe(true)
  })

  test('integers that can pass 2^31 (money over time, invoice amounts) are int64', () => {
    const schemas = doc.components.schemas
    const invoice = schemas.Invoice.properties
    const wide = [
      invoice.number,
      invoice.totalCents,
      invoice.lines.items.properties.quantity,
      invoice.lines.items.properties.unitPriceCents,
      invoice.lines.items.properties.amountCents,
      schemas.AgentStats.properties.revenueCents,
      schemas.CreatorStats.properties.totals.properties.revenueCents,
      schemas.AgentStatus.properties.balanceCents,
    ]
    for (const schema of wide) expect(schema).toMatchObject({ type: 'integer', format: 'int64' })
  })

  test('query integers and times are shown as what they stand for, with the bounds the route applies', async () => {
    const queries = operations(doc).flatMap(({ where, operation }) =>
      (operation.parameters ?? []).filter((p: any) => p.in === 'query').map((p: any) => ({ where, name: p.name, schema: p.schema })),
    )
    const shown = (name: string) => queries.filter(q => q.name === name)
    expect(shown('limit').length).toBeGreaterThanOrEqual(8)
    for (const q of shown('limit')) expect(q.schema, q.where).toMatchObject({ type: 'integer', minimum: 1, examples: [q.schema.default] })
    for (const q of [...shown('before'), ...shown('since')]) expect(q.schema, q.where).toMatchObject({ type: 'string', format: 'date-time' })
    for (const q of shown('offset')) expect(q.schema, q.where).toMatchObject({ type: 'integer', minimum: 0, maximum: 100_000, default: 0 })
    expect(shown('page')[0]!.schema).toMatchObject({ type: 'integer', minimum: 1, maximum: 1000, default: 1 })
    expect(JSON.stringify(doc)).not.toContain('x-shown-as')

    // The bounds shown are the route's: its maximum is taken, one more is refused.
    const invoices = queries.find(q => q.where === 'GET /v1/billing/invoices' && q.name === 'limit')!
    expect(invoices.schema).toMatchObject({ maximum: 100, default: 50 })
    const list = (limit: number) => ctx.call('GET', `/v1/billing/invoices?limit=${limit}`, { token: user.token })
    expect((await list(100)).status).toBe(200)
    const over = await list(101)
    expect(over.status).toBe(400)
    expect(over.body.details).toEqual([{ path: '/limit', message: 'must be an integer from 1 to 100' }])
    const feed = queries.find(q => q.where === 'GET /blog/feed' && q.name === 'limit')!
    expect(feed.schema).toMatchObject({ maximum: 50, default: 20 })
    expect((await ctx.call('GET', '/blog/feed?limit=51')).status).toBe(400)
    expect((await ctx.call('GET', '/blog/feed?limit=50&offset=100000')).status).toBe(200)
    expect((await ctx.call('GET', '/blog/feed?offset=100001')).status).toBe(400)
  })
})

describe('parameters', () => {
  test('say what they are on the parameter, where the reference page and generated clients show it', () => {
    let described = 0
    for (const { where, operation } of operations(doc)) {
      for (const parameter of operation.parameters ?? []) {
        // The route's TypeBox schema carries the words; a hoisted one by reference.
        const schema = parameter.schema.$ref ? doc.components.schemas[parameter.schema.$ref.split('/').pop()] : parameter.schema
        // The words a refusal of it is answered with are the service's, no JSON Schema keyword.
        expect(schema, `${where} ${parameter.name}`).not.toHaveProperty('error')
        if (typeof schema.description !== 'string') continue
        expect(parameter.description, `${where} ${parameter.name}`).toBe(schema.description)
        described++
      }
    }
    expect(described).toBeGreaterThan(60)
    // One path, two codes: the reader must see which each method takes.
    const [poll] = doc.paths['/v1/auth/device-codes/{code}'].get.parameters
    const [decide] = doc.paths['/v1/auth/device-codes/{code}'].patch.parameters
    expect([poll.description, decide.description]).toEqual([expect.stringContaining('deviceCode'), expect.stringContaining('userCode')])
  })

  test('include the request headers a route reads: Last-Event-ID of a stream, If-None-Match of a public document', () => {
    const headers = (operation: any) => (operation.parameters ?? []).filter((p: any) => p.in === 'header').map((p: any) => p.name)
    for (const { where, path, operation } of operations(doc)) {
      expect(headers(operation).includes('last-event-id'), where).toBe(path.startsWith('/v1/events/'))
      expect(headers(operation).includes('if-none-match'), where).toBe('304' in operation.responses)
    }
  })
})

describe('request bodies', () => {
  test('are application/json only, and optional only where the route takes none', () => {
    const bodies = operations(doc).filter(({ operation }) => operation.requestBody)
    expect(bodies.length).toBeGreaterThan(20)
    for (const { where, operation } of bodies) {
      expect(Object.keys(operation.requestBody.content), where).toEqual(['application/json'])
      // A device decision defaults to approve; a purchase's expected price may be left out with its body.
      const optional = where.startsWith('PATCH /v1/auth/device-codes/') || where === 'POST /v1/billing/configs/{id}/purchase'
      expect(operation.requestBody.required, where).toBe(!optional)
      expect(JSON.stringify(operation.requestBody), where).not.toContain('"undefined"')
    }
  })
})

describe('servers, security, licence and contact', () => {
  test('the server is SITE_URL; the document has a licence and a contact', () => {
    expect(doc.servers).toEqual([{ url: 'http://test.local', description: expect.any(String) }])
    expect(doc.info.license).toEqual({ name: expect.any(String), identifier: expect.any(String) })
    expect(doc.info.contact.url).toBe('http://test.local')
  })

  test('every operation says its security; the public ones an empty requirement', () => {
    const open: string[] = []
    for (const { operation } of operations(doc)) {
      expect(Array.isArray(operation.security), operation.operationId).toBe(true)
      if (operation.security.length === 0) open.push(operation.operationId)
    }
    expect(open.sort()).toEqual(
      [
        'health',
        'healthLive',
        'healthReady',
        'healthV1',
        'devicePage',
        'startDeviceAuthorization',
        'pollDeviceAuthorization',
        'chatStream',
        'getBlogFeed',
        'getBlogFeedRss',
        'listAgentBlogPosts',
        'getAgentBlogPost',
        'getAgentBlogRss',
        'getBlogPostReactions',
        'getAgentBlogPage',
        'getAgentBlogPostPage',
      ].sort(),
    )
  })
})

describe('security against behaviour', () => {
  // A well-formed key with a bad checksum and a token no verifier takes: each is refused before any
  // lookup, so a 401 to one says the operation reads that header. One that reads X-API-Key and lets
  // a good agent key through (not 403 for its kind) takes it, and its security must name it: a client
  // generated from the document sends only the schemes it lists, and learns there what 401 means.
  const badAgentKey = `sk_agt_${'A'.repeat(32)}AAAAAA`
  const badBearer = 'not-a-token'

  test('an operation that refuses a bad credential in a header lists that header’s scheme', async () => {
    for (const { path, method, operation, where } of operations(resolved)) {
      if (path.startsWith('/v1/events/')) continue
      const url = sampleUrl(path, operation)
      const schemes = new Set(operation.security.flatMap((requirement: object) => Object.keys(requirement)))
      const body = operation.requestBody ? {} : undefined
      const byKey = await ctx.call(method, url, { headers: { 'x-api-key': badAgentKey }, body })
      if (byKey.status === 401) {
        const good = await ctx.call(method, url, { apiKey: agent.apiKey, body })
        if (good.status !== 403) expect([...schemes], `${where} takes X-API-Key`).toContain('apiKey')
      }
      const byBearer = await ctx.call(method, url, { token: badBearer, body })
      if (byBearer.status === 401) expect([...schemes], `${where} reads Authorization`).toContain('bearer')
    }
  }, 60_000)
})

describe('failures', () => {
  test('every operation documents what the HTTP layer answers, with the headers that come with it', () => {
    for (const { where, operation } of operations(resolved)) {
      const statuses = Object.keys(operation.responses)
      // 400: every URL is checked at the door (percent-encoding, repeated query parameters).
      expect(statuses, where).toEqual(expect.arrayContaining(['400', '413', '414', '431', '500']))
      if (operation.operationId !== 'devicePage') expect(statuses, where).toContain('503')
      if (operation.requestBody) expect(statuses, where).toEqual(expect.arrayContaining(['400', '415']))
      if (operation.security.some((requirement: object) => Object.keys(requirement).length > 0)) {
        expect(statuses, where).toContain('401')
        expect(operation.responses['401'].headers, where).toHaveProperty('WWW-Authenticate')
      }
      // An API key the process has not cached may be refused by address (rule apiKeyMisses).
      if (operation.security.some((requirement: object) => 'bearer' in requirement || 'apiKey' in requirement))
        expect(statuses, where).toContain('429')
      if (operation.responses['429']) expect(operation.responses['429'].headers, where).toHaveProperty('Retry-After')
      if (operation.responses['503']) expect(operation.responses['503'].headers, where).toHaveProperty('Retry-After')
      // A repeat while the first request with its Idempotency-Key runs is 409 idempotency_key_in_progress, with Retry-After.
      if (operation.parameters?.some((p: any) => p.in === 'header' && p.name === 'idempotency-key')) {
        expect(operation.responses['409']?.headers, where).toHaveProperty('Retry-After')
        expect(operation.responses['409'].description, where).toContain('idempotency_key_in_progress')
        expect(operation.responses['409'].description, where).toContain('idempotency_key_reused')
      }
      // A body with a Content-Encoding is 415 with `Accept-Encoding: identity` (RFC 9110, 12.5.3).
      if (operation.requestBody) expect(operation.responses['415'].headers, where).toHaveProperty('Accept-Encoding')
    }
  })

  // Each operation is asked as a client gets it wrong: without a credential, with the wrong kind of
  // credential, with an empty or a form body. Whatever it answers must be documented for it.
  test('every status an operation answers to wrong requests is documented, in the envelope', async () => {
    const probes: { where: string; result: CallResult }[] = []
    for (const { path, method, operation, where } of operations(resolved)) {
      // Streams never end in process; their failures are covered in events.test.ts.
      if (path.startsWith('/v1/events/')) continue
      const url = sampleUrl(path, operation)
      const body = operation.requestBody ? {} : undefined
      const anonymous = await ctx.call(method, url, { body })
      probes.push({ where, result: anonymous })
      const open = operation.security.length === 0 || operation.security.some((requirement: object) => Object.keys(requirement).length === 0)
      // A body and the query are checked before the credential: an empty body or a missing parameter may be 400 first.
      const checkedFirst = body || operation.parameters?.some((p: any) => p.in === 'query' && p.required)
      if (!checkedFirst) expect(anonymous.status === 401, `${where} without a credential: ${anonymous.status}`).toBe(!open)
      else if (open) expect(anonymous.status, where).not.toBe(401)
      probes.push({ where, result: await ctx.call(method, url, { token: user.token, body }) })
      probes.push({ where, result: await ctx.call(method, url, { apiKey: agent.apiKey, body }) })
      if (operation.requestBody) {
        const form = await ctx.app.handle(
          new Request(`http://test.local${url}`, {
            method: method.toUpperCase(),
            headers: { authorization: `Bearer ${user.token}` },
            body: new URLSearchParams({ a: '1' }),
          }),
        )
        expect(form.status, where).toBe(415)
        probes.push({ where, result: { status: form.status, headers: form.headers, body: await form.json() } })
        const encoded = await ctx.call(method, url, { token: user.token, rawBody: '{}', headers: { 'content-encoding': 'gzip' } })
        expect(encoded.status, where).toBe(415)
        probes.push({ where, result: encoded })
      }
    }
    expect(probes.length).toBeGreaterThan(150)
    const seen = new Set<string>()
    for (const { where, result } of probes) {
      const [method, path] = where.split(' ')
      const documented = resolved.paths[path!][method!.toLowerCase()].responses
      expect(Object.keys(documented), `${where} answered ${result.status}: ${JSON.stringify(result.body)}`).toContain(String(result.status))
      seen.add(String(result.status))
      // The headers a client acts on are documented where they are sent.
      const response = documented[String(result.status)]
      for (const header of ['retry-after', 'www-authenticate', 'accept-encoding', 'x-request-id']) {
        if (result.headers.has(header))
          expect(
            Object.keys(response?.headers ?? {}).map(name => name.toLowerCase()),
            `${where} ${result.status} ${header}`,
          ).toContain(header)
      }
      const json = result.headers.get('content-type')?.startsWith('application/json')
      if (result.status >= 400 && json)
        expect(result.body, where).toMatchObject({ success: false, statusCode: result.status, error: expect.any(String) })
    }
    // The probes reached the failures they are meant to reach.
    expect([...seen].sort()).toEqual(expect.arrayContaining(['400', '401', '403', '404', '415']))
  }, 60_000)
})

describe('descriptions', () => {
  test('every operation has a description that says more than its summary', () => {
    const all = operations(doc)
    expect(all.length).toBeGreaterThan(70)
    for (const { where, operation } of all) {
      expect(typeof operation.summary, where).toBe('string')
      expect(typeof operation.description, where).toBe('string')
      expect(operation.description.trim().length, where).toBeGreaterThan(20)
      expect(operation.description.trim(), where).not.toBe(operation.summary.trim())
    }
  })
})

describe('redocly lint', () => {
  /**
   * Two warnings the URLs themselves make: /blog/posts/{postId} and /blog/{agentIdOrName}/posts (or
   * /rss) would both match /blog/posts/posts. The contract fixes both URLs, and no agent may be named
   * `posts` or `manage` (docs/limits.md), so the service never meets the ambiguity; the rule cannot
   * know that. Only these two are let through, by rule and place.
   */
  const contractAmbiguities = ['no-ambiguous-paths #/paths/~1blog~1{agentIdOrName}~1posts', 'no-ambiguous-paths #/paths/~1blog~1{agentIdOrName}~1rss']

  test('finds no error and no warning of its recommended rules (nor a schema example that does not fit, nor an undescribed operation)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'openapi-lint-'))
    try {
      writeFileSync(join(dir, 'openapi.json'), JSON.stringify(doc))
      writeFileSync(
        join(dir, 'redocly.yaml'),
        'extends:\n  - recommended\nrules:\n  no-invalid-schema-examples: error\n  operation-description: error\n',
      )
      const child = Bun.spawn(['node', require.resolve('@redocly/cli/bin/cli.js'), 'lint', 'openapi.json', '--format=json'], {
        cwd: dir,
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' },
        stdout: 'pipe',
        stderr: 'pipe',
      })
      const [output, errors] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text(), child.exited])
      let report: { problems: { ruleId: string; severity: string; message: string; location: { pointer: string }[] }[] }
      try {
        report = JSON.parse(output)
      } catch {
        throw new Error(`redocly lint printed no report: ${output.slice(0, 500)} ${errors.slice(-1000)}`)
      }
      const found = report.problems.map(problem => `${problem.ruleId} ${problem.location[0]?.pointer}`)
      const unexpected = report.problems
        .filter(problem => !contractAmbiguities.includes(`${problem.ruleId} ${problem.location[0]?.pointer}`))
        .map(problem => `${problem.severity} ${problem.ruleId} at ${problem.location.map(place => place.pointer).join(', ')}: ${problem.message}`)
      expect(unexpected).toEqual([])
      expect(found.sort()).toEqual(contractAmbiguities)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 60_000)
})
