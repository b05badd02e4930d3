/**
 * Runtime validators generated from the live document (@hey-api/openapi-ts, its zod plugin) hold
 * every answer of a real flow, strictly: each body parses, and parsing drops nothing (zod's objects
 * strip what their schema does not name, so a field the document lacks shows as a difference). The
 * malformed bodies the flow sends on purpose, which the server refuses, the validators refuse too.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { createAgent, createTestContext, signUp, type CallOptions, type CallResult, type TestContext } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { runInvoices } from '../src/invoices/run.ts'

let ctx: TestContext
let server: ReturnType<TestContext['app']['listen']>
let upstream: Upstream
// Inside node_modules, so that the generated module finds zod as the repository does.
let dir: string

beforeAll(async () => {
  ctx = await createTestContext({ actors: true, env: { PROXY_ALLOWED_HOSTS: '127.0.0.1' } })
  server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  upstream = startUpstream()
  mkdirSync(join(import.meta.dir, '../node_modules/.cache'), { recursive: true })
  dir = mkdtempSync(join(import.meta.dir, '../node_modules/.cache/openapi-validators-'))
})
afterAll(async () => {
  rmSync(dir, { recursive: true, force: true })
  upstream?.stop()
  await server?.stop()
  await ctx.close()
})

// A generated validator: zod 4's, of which the test uses one method.
type Validator = { safeParse(value: unknown): { success: true; data: unknown } | { success: false; error: { issues: unknown[] } } }

/** Generates the validators from the running server's document, as a user would with `npx @hey-api/openapi-ts`. */
async function generate(): Promise<Record<string, Validator>> {
  const cli = join(dirname(require.resolve('@hey-api/openapi-ts/package.json')), 'bin/run.js')
  const input = `http://127.0.0.1:${server.server!.port}/swagger/json`
  const child = Bun.spawn(['node', cli, '-i', input, '-o', dir, '-p', 'zod', '--no-log-file'], { cwd: dir, stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text(), child.exited])
  // The generator warns on stderr (an enum it cannot type, a $ref it skips) and goes on: a warning fails here too.
  expect({ code, stderr }, stdout).toEqual({ code: 0, stderr: '' })
  return import(join(dir, 'zod.gen.ts'))
}

const methods = ['get', 'put', 'post', 'patch', 'delete']
const capital = (name: string) => name[0]!.toUpperCase() + name.slice(1)
/** int64 fields parse to bigint: back to numbers, to compare with the body as sent. */
const plain = (value: unknown): unknown =>
  typeof value === 'bigint'
    ? Number(value)
    : Array.isArray(value)
      ? value.map(plain)
      : value && typeof value === 'object'
        ? Object.fromEntries(Object.entries(value).map(([key, item]) => [key, plain(item)]))
        : value

test('validators generated from /swagger/json accept every answer of a real flow as it is, and refuse what the server refuses', async () => {
  const validators = await generate()
  const doc = (await ctx.call('GET', '/swagger/json')).body
  const templates = Object.entries<Record<string, any>>(doc.paths).map(([template, item]) => ({
    item,
    pattern: new RegExp(`^${template.replace(/\./g, '\\.').replace(/\{[^}]+\}/g, '[^/]+')}$`),
  }))
  const problems: string[] = []
  const called = new Set<string>()

  /** Calls the app and holds the answer to the generated validator of its operation and status. */
  async function call(method: string, url: string, options: CallOptions = {}): Promise<CallResult> {
    const result = await ctx.call(method, url, options)
    const path = url.split('?')[0]!
    const operation = templates.find(({ item, pattern }) => pattern.test(path) && item[method.toLowerCase()])?.item[method.toLowerCase()]
    if (!operation) throw new Error(`no operation for ${method} ${url}`)
    const where = `${operation.operationId} (${method} ${url}) ${result.status}`
    called.add(operation.operationId)
    if (options.body !== undefined && result.status < 300) {
      const parsed = validators[`z${capital(operation.operationId)}Body`]!.safeParse(options.body)
      if (!parsed.success) problems.push(`${where}: the body sent is refused: ${JSON.stringify(parsed.error.issues)}`)
    }
    let response = operation.responses[String(result.status)]
    if (!response) {
      problems.push(`${where}: status not documented`)
      return result
    }
    if (response.$ref) response = doc.components.responses[response.$ref.split('/').pop()]
    const type = result.headers.get('content-type') ?? ''
    const media = Object.keys(response.content ?? {})
    if (media.length === 0) {
      if (result.body !== '') problems.push(`${where}: a body where the document has none`)
      return result
    }
    if (!media.some(name => type.startsWith(name))) problems.push(`${where}: ${type}, documented ${media.join(', ')}`)
    if (!type.startsWith('application/json')) return result
    // Successes by the operation's own validator; failures by the component their response names.
    const name =
      result.status < 300 ? `z${capital(operation.operationId)}Response` : `z${response.content['application/json'].schema.$ref.split('/').pop()}`
    const validator = validators[name]
    if (!validator) {
      problems.push(`${where}: no validator ${name}`)
      return result
    }
    const parsed = validator.safeParse(result.body)
    if (!parsed.success) problems.push(`${where}: ${JSON.stringify(parsed.error.issues)} in ${JSON.stringify(result.body).slice(0, 300)}`)
    else if (!Bun.deepEquals(plain(parsed.data), result.body, true))
      problems.push(`${where}: parsing changed ${JSON.stringify(result.body).slice(0, 300)} into ${JSON.stringify(plain(parsed.data)).slice(0, 300)}`)
    return result
  }

  /** A body the document refuses: the server answers 400 validation_failed, and the validator refuses it too. */
  async function refused(method: string, url: string, options: CallOptions & { body: unknown }) {
    const result = await call(method, url, options)
    const operation = templates.find(({ item, pattern }) => pattern.test(url) && item[method.toLowerCase()])!.item[method.toLowerCase()]
    const where = `${operation.operationId} with ${JSON.stringify(options.body)}`
    if (result.status !== 400 || result.body.error !== 'validation_failed') problems.push(`${where}: the server answered ${result.status}`)
    if (validators[`z${capital(operation.operationId)}Body`]!.safeParse(options.body).success)
      problems.push(`${where}: the generated validator accepts what the server refuses (${JSON.stringify(result.body.details)})`)
  }

  const owner = await signUp(ctx)
  const subscriber = await signUp(ctx)
  const stranger = await signUp(ctx)
  const o = { token: owner.token }
  const s = { token: subscriber.token }

  for (const url of ['/health', '/v1/health', '/health/live', '/health/ready']) await call('GET', url)
  await call('GET', '/v1/auth/me', s)
  await call('GET', '/v1/auth/me')
  await call('PATCH', '/v1/auth/me', { ...s, body: { walletAddress: '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed' } })
  await refused('PATCH', '/v1/auth/me', { ...s, body: { walletAddress: '0x1234' } })
  const key = await call('POST', '/v1/auth/api-keys', { ...s, body: { name: 'laptop' } })
  await call('GET', '/v1/auth/api-keys', s)
  await call('DELETE', `/v1/auth/api-keys/${key.body.data.id}`, s)
  await call('DELETE', `/v1/auth/api-keys/${key.body.data.id}`, s)
  await call('GET', '/v1/auth/me', { token: key.body.data.key })
  const device = await call('POST', '/v1/auth/device-codes')
  await call('GET', `/v1/auth/device-codes/${device.body.data.deviceCode}`)
  await call('GET', `/v1/auth/device-codes/${device.body.data.deviceCode}`)
  await call('PATCH', `/v1/auth/device-codes/${device.body.data.userCode}`, { ...s, body: { action: 'approve' } })
  ctx.clock.advance(5000)
  await call('GET', `/v1/auth/device-codes/${device.body.data.deviceCode}`)
  await call('PATCH', '/v1/auth/device-codes/BCDF-GHJK', { ...s, body: {} })
  await call('POST', '/v1/auth/sse-token', s)
  await call('GET', '/device?code=BCDF-GHJK')

  // An agent, its plans and a subscription to it.
  const name = `checked-${crypto.randomUUID().slice(0, 8)}`
  const created = await call('POST', '/v1/participants', { ...o, body: { name, displayName: 'Checked', description: 'Does things' } })
  const agentId: string = created.body.data.id
  await call('POST', '/v1/participants', { ...o, body: { name } })
  await refused('POST', '/v1/participants', { ...o, body: { name: 'X' } })
  await call('GET', '/v1/participants', o)
  await call('GET', `/v1/participants/${agentId}`, o)
  await call('GET', `/v1/participants/${name}`)
  await call('PATCH', `/v1/participants/${agentId}`, { ...o, body: { settings: { blogEnabled: true }, description: null } })
  await call('PATCH', `/v1/participants/${agentId}`, { ...s, body: { displayName: 'Mine' } })
  const a = { apiKey: (await call('POST', `/v1/participants/${agentId}/api-key`, o)).body.data.apiKey as string }
  const other = await createAgent(ctx, stranger)
  const second = await createAgent(ctx, owner)
  const terms = { participantId: agentId, monthlyPriceCents: 900, includedProxyCalls: 2, overagePerCallCents: 1 }
  const plan = await call('POST', '/v1/billing/plans', { ...o, body: { ...terms, name: 'Pro', description: 'The plan' } })
  await call('POST', '/v1/billing/plans', { ...s, body: { ...terms, name: 'Theirs' } })
  const old = await call('POST', '/v1/billing/plans', { ...o, body: { ...terms, name: 'Old' } })
  await call('PATCH', `/v1/billing/plans/${plan.body.data.id}`, { ...o, body: { description: 'Better' } })
  await call('DELETE', `/v1/billing/plans/${old.body.data.id}`, o)
  await call('GET', `/v1/billing/plans/${agentId}`, s)
  await call('GET', `/v1/billing/plans/${agentId}`, o)
  await call('POST', '/v1/billing/subscriptions', { ...s, body: { planId: old.body.data.id } })
  const subscribe = { ...s, headers: { 'idempotency-key': `subscribe-${name}` }, body: { planId: plan.body.data.id } }
  const subscription = await call('POST', '/v1/billing/subscriptions', subscribe)
  await call('POST', '/v1/billing/subscriptions', subscribe)
  await call('POST', '/v1/billing/subscriptions', { ...s, body: { planId: plan.body.data.id } })
  await call('POST', '/v1/billing/subscriptions', { ...o, body: { planId: plan.body.data.id } })
  await call('GET', '/v1/billing/subscriptions?limit=1', s)
  await call('GET', '/v1/billing/subscriptions?limit=0', s)

  // A conversation, polled and answered.
  await call('POST', `/v1/conversations/${agentId}/messages`, { ...s, body: { text: 'Hello, agent' } })
  await refused('POST', `/v1/conversations/${agentId}/messages`, { ...s, body: { text: '' } })
  await call('POST', `/v1/conversations/${other.id}/messages`, { ...s, body: { text: 'Hi' } })
  await call('POST', `/v1/conversations/${agentId}/messages`, { ...s, rawBody: '{"text":' })
  await call('GET', '/v1/agent/events', a)
  await call('GET', '/v1/agent/events?since=yesterday', a)
  await call('GET', '/v1/agent/status', a)
  await call('GET', '/v1/agent/status', o)
  const reply = { ...a, headers: { 'idempotency-key': `reply-${name}` }, body: { userId: subscriber.id, text: 'Hello, subscriber' } }
  await call('POST', '/v1/agent/conversation-reply', reply)
  await call('POST', '/v1/agent/conversation-reply', reply)
  await call('POST', '/v1/agent/conversation-reply', { ...reply, body: { userId: subscriber.id, text: 'Another' } })
  await call('POST', '/v1/agent/conversation-reply', { ...a, body: { userId: stranger.id, text: 'Hello?' } })
  await call('GET', `/v1/conversations/${agentId}/messages?limit=10`, s)

  // Service requests: answered, failed, expired.
  const asked = await call('POST', '/v1/agent/service-requests', {
    apiKey: other.apiKey,
    body: { targetAgentName: name, serviceTag: 'sum', input: 'Text' },
  })
  await call('POST', '/v1/agent/service-requests', { apiKey: other.apiKey, body: { targetAgentName: 'nobody-here', input: 'x' } })
  await call('GET', '/v1/agent/events', a)
  await call('POST', '/v1/agent/service-respond', { ...a, body: { requestId: asked.body.data.requestId, output: 'Done', success: true } })
  await call('POST', '/v1/agent/service-respond', { ...a, body: { requestId: asked.body.data.requestId, output: 'Done', success: true } })
  await call('GET', `/v1/agent/service-requests/${asked.body.data.requestId}`, { apiKey: other.apiKey })
  const failed = await call('POST', '/v1/agent/service-requests', { apiKey: other.apiKey, body: { targetAgentId: second.id, input: 'Fail' } })
  await call('POST', '/v1/agent/service-respond', {
    apiKey: second.apiKey,
    body: { requestId: failed.body.data.requestId, output: 'No', success: false },
  })
  await call('GET', `/v1/agent/service-requests/${failed.body.data.requestId}`, { apiKey: other.apiKey })
  const expiring = await call('POST', '/v1/agent/service-requests', { apiKey: other.apiKey, body: { targetAgentId: second.id, input: 'Wait' } })
  await call('GET', `/v1/agent/service-requests/${crypto.randomUUID()}`, a)

  // Shared context, by the agent and by the user.
  const entry = { userId: subscriber.id, type: 'brand', key: 'voice', data: { tone: 'warm' } }
  await call('POST', '/v1/agent/context', { ...a, body: { ...entry, confidence: 'derived', source: { method: 'chat' } } })
  await call('POST', '/v1/agent/context', { ...a, body: { ...entry, confidence: 'user_provided' } })
  await call('GET', `/v1/agent/context?userId=${subscriber.id}&type=brand&key=voice`, a)
  await call('GET', `/v1/agent/context?userId=${subscriber.id}&type=nope`, a)
  await call('GET', `/v1/agent/context?userId=${stranger.id}`, a)
  await call('PUT', '/v1/context/brand/voice', { ...s, body: { data: { tone: 'dry' } } })
  await call('POST', '/v1/agent/context', { ...a, body: entry })
  await call('GET', '/v1/context', s)
  await call('GET', '/v1/context/brand/voice/versions', s)
  await call('GET', '/v1/context/brand/missing/versions', s)
  await call('POST', '/v1/context/brand/voice/revert', { ...s, body: { version: 1 } })
  await call('POST', '/v1/context/brand/voice/revert', { ...s, body: { version: 99 } })

  // A connected account and proxy calls past the included ones.
  const connection = await call('POST', '/v1/connections', {
    ...s,
    body: { provider: 'acme', baseUrl: `${upstream.url}/api`, credential: 'secret', label: 'Acme' },
  })
  await call('GET', '/v1/connections', s)
  const proxied = {
    userId: subscriber.id,
    provider: 'acme',
    method: 'POST',
    path: '/echo',
    query: { q: 'x', n: 1 },
    headers: { 'x-trace': '1' },
    body: { a: 1 },
  }
  for (let i = 0; i < 3; i++)
    await call('POST', '/v1/agent/proxy-call', { ...a, headers: { 'idempotency-key': `proxy-${name}-${i}` }, body: proxied })
  await call('POST', '/v1/agent/proxy-call', { ...a, body: { ...proxied, path: '/status/418' } })
  await call('POST', '/v1/agent/proxy-call', { ...a, body: { ...proxied, provider: 'none' } })
  await call('POST', '/v1/agent/proxy-call', { ...a, body: { ...proxied, userId: stranger.id } })
  await call('POST', '/v1/agent/proxy-call', { ...a, body: { ...proxied, method: 'GET', path: '/big', body: undefined } })
  await call('DELETE', `/v1/connections/${connection.body.data.id}`, s)
  await call('DELETE', `/v1/connections/${connection.body.data.id}`, s)

  // Config listings, a purchase, reviews, stats.
  const listing = { participantId: agentId, name: 'Rules', priceCents: 300, fileType: '.cursorrules', content: 'Be brief.' }
  const config = await call('POST', '/v1/billing/configs', { ...o, body: { ...listing, description: 'Rules', previewSnippet: 'Be' } })
  await call('GET', `/v1/billing/configs/${agentId}`, s)
  await call('GET', `/v1/billing/configs/${agentId}`, o)
  await call('PATCH', `/v1/billing/configs/${config.body.data.id}`, { ...o, body: { priceCents: 400 } })
  await call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { ...s, headers: { 'idempotency-key': `buy-${name}` } })
  await call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, s)
  await call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, o)
  await call('GET', '/v1/billing/my-configs', s)
  const gone = await call('POST', '/v1/billing/configs', { ...o, body: { ...listing, name: 'Gone' } })
  await call('DELETE', `/v1/billing/configs/${gone.body.data.id}`, o)
  await call('POST', `/v1/billing/configs/${gone.body.data.id}/purchase`, s)
  await call('POST', '/v1/billing/reviews', { ...s, body: { participantId: agentId, rating: 5, comment: 'Great' } })
  await call('POST', '/v1/billing/reviews', { ...s, body: { participantId: agentId, rating: 4, comment: null } })
  await refused('POST', '/v1/billing/reviews', { ...s, body: { participantId: agentId, rating: 6 } })
  await call('POST', '/v1/billing/reviews', { token: stranger.token, body: { participantId: agentId, rating: 1 } })
  await call('GET', `/v1/billing/reviews/${agentId}?limit=5`, s)
  await call('GET', '/v1/billing/creator-stats', o)
  await call('DELETE', `/v1/billing/subscriptions/${subscription.body.data.id}`, { token: stranger.token })
  await call('DELETE', `/v1/billing/subscriptions/${subscription.body.data.id}`, s)
  await call('DELETE', `/v1/billing/subscriptions/${subscription.body.data.id}`, s)

  // World chat, and what the HTTP layer refuses.
  await call('POST', '/v1/chat/messages', { ...s, body: { text: 'Hi world' } })
  await call('POST', '/v1/chat/messages', { ...a, body: { text: 'Hi from the agent' } })
  await call('GET', '/v1/chat/messages?limit=5', s)
  await call('GET', '/v1/chat/messages?limit=500', s)
  await call('GET', '/v1/chat/messages')
  await call('POST', '/v1/chat/messages', { ...s, headers: { 'content-type': 'text/plain' }, rawBody: 'hi' })
  await call('POST', '/v1/chat/messages', { ...s, rawBody: JSON.stringify({ text: 'x'.repeat(1_100_000) }) })
  await call('GET', `/v1/chat/messages?x=${'a'.repeat(9000)}`, s)
  await call('GET', '/v1/chat/messages', { ...s, headers: { 'x-big': 'a'.repeat(20_000) } })

  // The blog: drafts, scheduled and published posts, public pages and feeds, reactions.
  const draft = await call('POST', '/blog/posts', { ...a, body: { title: 'First Post', content: 'Some *text*', tags: ['x'] } })
  const later = new Date(ctx.clock.now().getTime() + 86_400_000).toISOString()
  await call('POST', '/blog/posts', { ...o, body: { participantId: agentId, title: 'Later', content: 'Later', publishAt: later } })
  const post = await call('POST', '/blog/posts', {
    ...o,
    body: { participantId: agentId, title: 'Now', content: 'Now', excerpt: 'Short', publish: true },
  })
  await call('POST', '/blog/posts', { apiKey: other.apiKey, body: { participantId: agentId, title: 'Theirs', content: 'x' } })
  await call('POST', '/blog/posts', { apiKey: other.apiKey, body: { title: 'Disabled', content: 'x' } })
  await call('GET', `/blog/posts/${draft.body.data.id}`, a)
  await call('PATCH', `/blog/posts/${draft.body.data.id}`, { ...a, body: { status: 'published', tags: ['x', 'y'] } })
  await call('GET', `/blog/manage/${agentId}?limit=10`, o)
  await call('GET', `/blog/manage/${agentId}?status=draft`, a)
  const feed = await call('GET', '/blog/feed?tag=x')
  await call('GET', '/blog/feed?tag=x', { headers: { 'if-none-match': feed.headers.get('etag')! } })
  await call('GET', '/blog/feed.xml')
  await call('GET', `/blog/${name}/posts`)
  await call('GET', `/blog/${agentId}/posts/first-post`)
  await call('GET', `/blog/${name}/posts/nothing`)
  await call('GET', `/blog/${name}/rss`)
  await call('GET', `/@${name}/blog`)
  await call('GET', `/@${name}/blog/first-post`)
  await call('GET', `/@${name}/blog/nothing`)
  await call('POST', `/blog/posts/${post.body.data.id}/reactions`, { ...s, body: { type: 'like' } })
  await call('POST', `/blog/posts/${post.body.data.id}/reactions`, { ...s, body: { type: 'like' } })
  await call('POST', `/blog/posts/${post.body.data.id}/reactions`, { ...a, body: { type: 'helpful' } })
  await refused('POST', `/blog/posts/${post.body.data.id}/reactions`, { ...s, body: { type: 'meh' } })
  await call('DELETE', `/blog/posts/${post.body.data.id}/reactions`, { ...a, body: { type: 'helpful' } })
  await refused('DELETE', `/blog/posts/${post.body.data.id}/reactions`, { ...a, body: { type: 'meh' } })
  await call('GET', `/blog/posts/${post.body.data.id}/reactions`)
  await call('DELETE', `/blog/posts/${draft.body.data.id}`, a)
  await call('GET', `/blog/posts/${draft.body.data.id}`, a)

  // A month on: the request expired, the periods invoiced (subscription, overage and purchase lines).
  ctx.clock.advance(40 * 86_400_000)
  await call('GET', `/v1/agent/service-requests/${expiring.body.data.requestId}`, { apiKey: other.apiKey })
  await runInvoices(ctx.deps, ctx.clock.now())
  const invoices = await call('GET', '/v1/billing/invoices?limit=10', s)
  expect(invoices.body.data.flatMap((invoice: { lines: { kind: string }[] }) => invoice.lines.map(line => line.kind)).sort()).toEqual([
    'config_purchase',
    'overage',
    'subscription',
  ])
  await call('GET', '/v1/billing/subscriptions', s)
  await call('GET', '/v1/billing/creator-stats', o)
  await call('DELETE', `/v1/participants/${agentId}`, o)
  await call('GET', `/v1/participants/${agentId}`)

  expect(problems).toEqual([])
  // Every operation was met, but the event streams, which never end (events.test.ts reads them).
  const operations = Object.values<Record<string, any>>(doc.paths).flatMap(item =>
    methods.filter(method => item[method]).map(method => item[method].operationId),
  )
  expect(operations.filter(id => !called.has(id)).sort()).toEqual(['chatStream', 'notificationStream'])
}, 60_000)
