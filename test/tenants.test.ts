/**
 * Cross-tenant sweep, driven by the OpenAPI document so that no route is missed: every operation is
 * called with no credential, a credential of the wrong kind, and another tenant's credential aimed at
 * tenant A's resources (and at ids that do not exist). No answer may carry A's private values, and A's
 * resources must read the same afterwards.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import {
  createAgent,
  createTestContext,
  signUp,
  subscribedPair,
  type CallOptions,
  type CallResult,
  type TestAgent,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
// Tenant A: an owner with an agent, a subscriber of it, and everything they made.
let ownerA: TestUser
let agentA: TestAgent
let subA: TestUser
// Tenant B: another owner with an agent, and a subscriber of that agent (a customer, but not of A).
let ownerB: TestUser
let agentB: TestAgent
let subB: TestUser

/** Strings only tenant A's own credentials may ever be answered. */
const secret = (what: string) => `SECRET-${what}-${randomUUID().slice(0, 8)}`
const markers = {
  inactivePlan: secret('plan'),
  config: secret('config-content'),
  inactiveConfig: secret('inactive-config'),
  draft: secret('draft'),
  scheduled: secret('scheduled'),
  connectionLabel: secret('label'),
  credential: secret('credential'),
  apiKeyName: secret('key-name'),
  context: secret('context'),
  request: secret('service-input'),
  message: secret('message'),
  reply: secret('reply'),
}
const ids = {} as {
  plan: string
  inactivePlan: string
  subscription: string
  config: string
  inactiveConfig: string
  draft: string
  draftSlug: string
  scheduled: string
  connection: string
  apiKey: string
  request: string
  userCode: string
  deviceCode: string
  sseToken: string
}

beforeAll(async () => {
  ctx = await createTestContext({ actors: true, env: { PROXY_ALLOWED_HOSTS: '127.0.0.1' } })
  ownerA = await signUp(ctx)
  ownerB = await signUp(ctx)
  const pairA = await subscribedPair(ctx, ownerA)
  const pairB = await subscribedPair(ctx, ownerB)
  ;[agentA, subA, agentB, subB] = [pairA.agent, pairA.user, pairB.agent, pairB.user]
  ids.plan = pairA.planId
  ids.subscription = pairA.subscriptionId
  const as = (user: TestUser) => ({ token: user.token })
  const must = async (status: number, method: string, path: string, options: CallOptions) => {
    const res = await ctx.call(method, path, options)
    if (res.status !== status) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.body)}`)
    return res.body.data
  }
  const plan = { participantId: agentA.id, name: markers.inactivePlan, monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 }
  ids.inactivePlan = (await must(201, 'POST', '/v1/billing/plans', { ...as(ownerA), body: plan })).id
  await must(200, 'DELETE', `/v1/billing/plans/${ids.inactivePlan}`, as(ownerA))
  const config = { participantId: agentA.id, name: 'C', priceCents: 5, fileType: 'md', content: markers.config }
  ids.config = (await must(201, 'POST', '/v1/billing/configs', { ...as(ownerA), body: config })).id
  await must(201, 'POST', `/v1/billing/configs/${ids.config}/purchase`, as(subA))
  const inactive = { ...config, name: markers.inactiveConfig, content: markers.inactiveConfig }
  ids.inactiveConfig = (await must(201, 'POST', '/v1/billing/configs', { ...as(ownerA), body: inactive })).id
  await must(200, 'DELETE', `/v1/billing/configs/${ids.inactiveConfig}`, as(ownerA))
  await must(200, 'PATCH', `/v1/participants/${agentA.id}`, { ...as(ownerA), body: { settings: { blogEnabled: true } } })
  const draft = await must(201, 'POST', '/blog/posts', { apiKey: agentA.apiKey, body: { title: markers.draft, content: markers.draft } })
  ;[ids.draft, ids.draftSlug] = [draft.id, draft.slug]
  const publishAt = new Date(ctx.clock.now().getTime() + 86_400_000).toISOString()
  const scheduled = { title: markers.scheduled, content: markers.scheduled, publishAt }
  ids.scheduled = (await must(201, 'POST', '/blog/posts', { apiKey: agentA.apiKey, body: scheduled })).id
  await must(201, 'POST', '/blog/posts', { apiKey: agentA.apiKey, body: { title: 'Public', content: 'Public text', publish: true } })
  const connection = { provider: 'acme', baseUrl: 'http://127.0.0.1:9', credential: markers.credential, label: markers.connectionLabel }
  ids.connection = (await must(201, 'POST', '/v1/connections', { ...as(subA), body: connection })).id
  ids.apiKey = (await must(201, 'POST', '/v1/auth/api-keys', { ...as(ownerA), body: { name: markers.apiKeyName } })).id
  await must(200, 'PUT', '/v1/context/brand/main', { ...as(subA), body: { data: { name: markers.context } } })
  await must(201, 'POST', `/v1/conversations/${agentA.id}/messages`, { ...as(subA), body: { text: markers.message } })
  await must(201, 'POST', '/v1/agent/conversation-reply', { apiKey: agentA.apiKey, body: { userId: subA.id, text: markers.reply } })
  await must(201, 'POST', `/v1/conversations/${agentA.id}/messages`, { ...as(subA), body: { text: markers.message } })
  const target = await createAgent(ctx, ownerA)
  const request = { targetAgentId: target.id, input: markers.request }
  ids.request = (await must(201, 'POST', '/v1/agent/service-requests', { apiKey: agentA.apiKey, body: request })).requestId
  const device = await must(201, 'POST', '/v1/auth/device-codes', {})
  ;[ids.deviceCode, ids.userCode] = [device.deviceCode, device.userCode]
  await must(200, 'PATCH', `/v1/auth/device-codes/${ids.userCode}`, as(ownerA))
  ids.sseToken = (await must(200, 'POST', '/v1/auth/sse-token', as(ownerA))).token
}, 60_000)
afterAll(() => ctx.close())

type Attacker = 'none' | 'userB' | 'subB' | 'agentB'
const attackers: Attacker[] = ['none', 'userB', 'subB', 'agentB']
const credentials = (who: Attacker): CallOptions =>
  who === 'userB' ? { token: ownerB.token } : who === 'subB' ? { token: subB.token } : who === 'agentB' ? { apiKey: agentB.apiKey } : {}

/** A status, a status and error code, or 'ok' for any 2xx (a public or own-data answer). */
type Expected = number | [number, string] | 'ok'

interface Case {
  operationId: string
  /** The request, built once the world exists; `missing` swaps A's ids for ones that do not exist. */
  request(missing: boolean): { method: string; path: string; body?: unknown }
  expect: Record<Attacker, Expected>
  /** What an id that does not exist answers, for the caller kind the route is for (checked when set). */
  missing?: Expected
  /** The caller's own data only: the answer names none of A's ids at all. */
  ownOnly?: boolean
}

const unauthorized: Expected = [401, 'unauthorized']
const forbidden: Expected = [403, 'forbidden']
const notFound: Expected = [404, 'not_found']
const id = (value: string, missing: boolean) => (missing ? randomUUID() : value)

/** A user route acting on the caller's own data: any user may, an agent key may not. */
const ownUserRoute = (operationId: string, method: string, path: string, body?: unknown): Case => ({
  operationId,
  request: () => ({ method, path, body }),
  expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: forbidden },
  ownOnly: true,
})
/** An owner's route on one of A's resources: 403 to other users (the contract's "not the owner"). */
const ownerRoute = (operationId: string, method: string, path: (missing: boolean) => string, body?: unknown): Case => ({
  operationId,
  request: missing => ({ method, path: path(missing), body }),
  expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
  missing: notFound,
})
/** A route on something A alone may see: it looks to others like one that does not exist. */
const privateRoute = (operationId: string, method: string, path: (missing: boolean) => string, body?: unknown): Case => ({
  operationId,
  request: missing => ({ method, path: path(missing), body }),
  expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: forbidden },
  missing: notFound,
})
const publicRoute = (operationId: string, method: string, path: string): Case => ({
  operationId,
  request: () => ({ method, path }),
  expect: { none: 'ok', userB: 'ok', subB: 'ok', agentB: 'ok' },
})
/** An agent route aimed at A's agent's subscriber or request. */
const agentRoute = (operationId: string, method: string, path: string, body: (missing: boolean) => unknown, other: Expected): Case => ({
  operationId,
  request: missing => ({ method, path, body: body(missing) }),
  expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: other },
})

const cases: Case[] = [
  publicRoute('health', 'GET', '/health'),
  publicRoute('healthV1', 'GET', '/v1/health'),
  publicRoute('healthLive', 'GET', '/health/live'),
  publicRoute('healthReady', 'GET', '/health/ready'),
  ownUserRoute('getProfile', 'GET', '/v1/auth/me'),
  ownUserRoute('updateProfile', 'PATCH', '/v1/auth/me', { walletAddress: null }),
  ownUserRoute('createApiKey', 'POST', '/v1/auth/api-keys', { name: 'mine' }),
  ownUserRoute('listApiKeys', 'GET', '/v1/auth/api-keys'),
  privateRoute('revokeApiKey', 'DELETE', m => `/v1/auth/api-keys/${id(ids.apiKey, m)}`),
  {
    operationId: 'startDeviceAuthorization',
    request: () => ({ method: 'POST', path: '/v1/auth/device-codes' }),
    expect: { none: 201, userB: 201, subB: 201, agentB: 201 },
  },
  {
    // The device code is the device's secret; an unknown one is all another caller can name.
    operationId: 'pollDeviceAuthorization',
    request: () => ({ method: 'GET', path: `/v1/auth/device-codes/${randomUUID()}` }),
    expect: { none: notFound, userB: notFound, subB: notFound, agentB: notFound },
  },
  {
    // A's code, approved by A: another user can neither deny it nor approve it as theirs.
    operationId: 'decideDeviceAuthorization',
    request: () => ({ method: 'PATCH', path: `/v1/auth/device-codes/${ids.userCode}`, body: { action: 'deny' } }),
    expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: forbidden },
  },
  ownUserRoute('issueSseToken', 'POST', '/v1/auth/sse-token'),
  publicRoute('devicePage', 'GET', '/device'),
  {
    operationId: 'createParticipant',
    request: () => ({ method: 'POST', path: '/v1/participants', body: { name: agentA.name } }),
    expect: { none: unauthorized, userB: [409, 'name_taken'], subB: [409, 'name_taken'], agentB: forbidden },
  },
  ownUserRoute('listMyParticipants', 'GET', '/v1/participants'),
  {
    operationId: 'getParticipant',
    request: missing => ({ method: 'GET', path: `/v1/participants/${id(agentA.id, missing)}` }),
    expect: { none: 'ok', userB: 'ok', subB: 'ok', agentB: 'ok' },
    missing: notFound,
  },
  ownerRoute('updateParticipant', 'PATCH', m => `/v1/participants/${id(agentA.id, m)}`, { settings: { blogEnabled: false } }),
  ownerRoute('deactivateParticipant', 'DELETE', m => `/v1/participants/${id(agentA.id, m)}`),
  ownerRoute('rotateParticipantKey', 'POST', m => `/v1/participants/${id(agentA.id, m)}/api-key`),
  {
    operationId: 'createPlan',
    request: missing => ({
      method: 'POST',
      path: '/v1/billing/plans',
      body: { participantId: id(agentA.id, missing), name: 'X', monthlyPriceCents: 0, includedProxyCalls: 0, overagePerCallCents: 0 },
    }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
    missing: notFound,
  },
  {
    operationId: 'listPlans',
    request: missing => ({ method: 'GET', path: `/v1/billing/plans/${id(agentA.id, missing)}` }),
    expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: 'ok' },
    missing: notFound,
  },
  ownerRoute('updatePlan', 'PATCH', m => `/v1/billing/plans/${id(ids.plan, m)}`, { monthlyPriceCents: 0 }),
  ownerRoute('deactivatePlan', 'DELETE', m => `/v1/billing/plans/${id(ids.plan, m)}`),
  {
    operationId: 'subscribe',
    request: missing => ({ method: 'POST', path: '/v1/billing/subscriptions', body: { planId: id(ids.inactivePlan, missing) } }),
    expect: { none: unauthorized, userB: [409, 'plan_inactive'], subB: [409, 'plan_inactive'], agentB: forbidden },
    missing: notFound,
  },
  ownUserRoute('listSubscriptions', 'GET', '/v1/billing/subscriptions'),
  privateRoute('cancelSubscription', 'DELETE', m => `/v1/billing/subscriptions/${id(ids.subscription, m)}`),
  {
    operationId: 'writeReview',
    request: missing => ({ method: 'POST', path: '/v1/billing/reviews', body: { participantId: id(agentA.id, missing), rating: 1 } }),
    expect: { none: unauthorized, userB: [403, 'not_a_customer'], subB: [403, 'not_a_customer'], agentB: forbidden },
    missing: notFound,
  },
  {
    operationId: 'listReviews',
    request: missing => ({ method: 'GET', path: `/v1/billing/reviews/${id(agentA.id, missing)}` }),
    expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: 'ok' },
    missing: notFound,
  },
  {
    operationId: 'createConfig',
    request: missing => ({
      method: 'POST',
      path: '/v1/billing/configs',
      body: { participantId: id(agentA.id, missing), name: 'X', priceCents: 0, fileType: 'md', content: 'x' },
    }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
    missing: notFound,
  },
  {
    operationId: 'listConfigs',
    request: missing => ({ method: 'GET', path: `/v1/billing/configs/${id(agentA.id, missing)}` }),
    expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: 'ok' },
    missing: notFound,
  },
  ownerRoute('updateConfig', 'PATCH', m => `/v1/billing/configs/${id(ids.config, m)}`, { priceCents: 0 }),
  ownerRoute('deactivateConfig', 'DELETE', m => `/v1/billing/configs/${id(ids.config, m)}`),
  {
    operationId: 'purchaseConfig',
    request: missing => ({ method: 'POST', path: `/v1/billing/configs/${id(ids.inactiveConfig, missing)}/purchase` }),
    expect: { none: unauthorized, userB: [409, 'config_inactive'], subB: [409, 'config_inactive'], agentB: forbidden },
    missing: notFound,
  },
  ownUserRoute('listMyConfigs', 'GET', '/v1/billing/my-configs'),
  ownUserRoute('creatorStats', 'GET', '/v1/billing/creator-stats'),
  {
    operationId: 'sendMessage',
    request: missing => ({ method: 'POST', path: `/v1/conversations/${id(agentA.id, missing)}/messages`, body: { text: 'hi' } }),
    expect: { none: unauthorized, userB: [403, 'not_subscribed'], subB: [403, 'not_subscribed'], agentB: forbidden },
    missing: notFound,
  },
  {
    operationId: 'listMessages',
    request: missing => ({ method: 'GET', path: `/v1/conversations/${id(agentA.id, missing)}/messages` }),
    expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: forbidden },
    missing: notFound,
  },
  agentRoute('replyToConversation', 'POST', '/v1/agent/conversation-reply', m => ({ userId: id(subA.id, m), text: 'x' }), notFound),
  { ...agentRoute('pollAgentEvents', 'GET', '/v1/agent/events', () => undefined, 'ok'), ownOnly: true },
  { ...agentRoute('agentStatus', 'GET', '/v1/agent/status', () => undefined, 'ok'), ownOnly: true },
  agentRoute('createServiceRequest', 'POST', '/v1/agent/service-requests', () => ({ targetAgentId: randomUUID(), input: 'x' }), notFound),
  {
    operationId: 'getServiceRequest',
    request: missing => ({ method: 'GET', path: `/v1/agent/service-requests/${id(ids.request, missing)}` }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: notFound },
    missing: notFound,
  },
  agentRoute(
    'respondToServiceRequest',
    'POST',
    '/v1/agent/service-respond',
    m => ({ requestId: id(ids.request, m), output: 'x', success: true }),
    notFound,
  ),
  {
    operationId: 'readContextAsAgent',
    request: () => ({ method: 'GET', path: `/v1/agent/context?userId=${subA.id}` }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: [403, 'not_subscribed'] },
  },
  agentRoute(
    'writeContextAsAgent',
    'POST',
    '/v1/agent/context',
    () => ({ userId: subA.id, type: 'brand', key: 'main', data: { name: 'overwritten' } }),
    [403, 'not_subscribed'],
  ),
  agentRoute('proxyCall', 'POST', '/v1/agent/proxy-call', () => ({ userId: subA.id, provider: 'acme', method: 'GET', path: '/' }), [
    403,
    'not_subscribed',
  ]),
  ownUserRoute('readContext', 'GET', '/v1/context'),
  {
    operationId: 'listContextVersions',
    request: () => ({ method: 'GET', path: '/v1/context/brand/main/versions' }),
    expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: forbidden },
  },
  {
    operationId: 'revertContext',
    request: () => ({ method: 'POST', path: '/v1/context/brand/main/revert', body: { version: 1 } }),
    expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: forbidden },
  },
  // Writes the caller's own organization; A's is checked unchanged afterwards.
  ownUserRoute('writeContext', 'PUT', '/v1/context/brand/main', { data: { name: 'mine' } }),
  ownUserRoute('listInvoices', 'GET', '/v1/billing/invoices'),
  ownUserRoute('createConnection', 'POST', '/v1/connections', { provider: 'acme', baseUrl: 'http://127.0.0.1:9', credential: 'mine' }),
  ownUserRoute('listConnections', 'GET', '/v1/connections'),
  privateRoute('deleteConnection', 'DELETE', m => `/v1/connections/${id(ids.connection, m)}`),
  {
    // HEAD: the answer a GET would open a stream with. A's one-use token was issued to A alone.
    operationId: 'notificationStream',
    request: () => ({ method: 'HEAD', path: '/v1/events/stream' }),
    expect: { none: 401, userB: 200, subB: 200, agentB: 403 },
  },
  {
    operationId: 'chatStream',
    request: () => ({ method: 'HEAD', path: '/v1/events/chat' }),
    expect: { none: 200, userB: 200, subB: 200, agentB: 200 },
  },
  {
    operationId: 'postChatMessage',
    request: () => ({ method: 'POST', path: '/v1/chat/messages', body: { text: 'hello' } }),
    expect: { none: unauthorized, userB: 201, subB: 201, agentB: 201 },
  },
  {
    operationId: 'listChatMessages',
    request: () => ({ method: 'GET', path: '/v1/chat/messages' }),
    expect: { none: unauthorized, userB: 'ok', subB: 'ok', agentB: 'ok' },
  },
  {
    operationId: 'createBlogPost',
    request: missing => ({ method: 'POST', path: '/blog/posts', body: { participantId: id(agentA.id, missing), title: 'X', content: 'x' } }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
  },
  ...(['GET', 'PATCH', 'DELETE'] as const).map((method): Case => ({
    operationId: { GET: 'getBlogPost', PATCH: 'updateBlogPost', DELETE: 'deleteBlogPost' }[method],
    request: missing => ({ method, path: `/blog/posts/${id(ids.draft, missing)}`, body: method === 'PATCH' ? { status: 'published' } : undefined }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
    missing: notFound,
  })),
  {
    operationId: 'listManagedBlogPosts',
    request: missing => ({ method: 'GET', path: `/blog/manage/${id(agentA.id, missing)}` }),
    expect: { none: unauthorized, userB: forbidden, subB: forbidden, agentB: forbidden },
    missing: notFound,
  },
  {
    operationId: 'reactToBlogPost',
    request: missing => ({ method: 'POST', path: `/blog/posts/${id(ids.scheduled, missing)}/reactions`, body: { type: 'like' } }),
    expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: notFound },
  },
  {
    operationId: 'removeBlogPostReaction',
    request: missing => ({ method: 'DELETE', path: `/blog/posts/${id(ids.scheduled, missing)}/reactions`, body: { type: 'like' } }),
    expect: { none: unauthorized, userB: notFound, subB: notFound, agentB: notFound },
  },
  {
    operationId: 'getBlogPostReactions',
    request: () => ({ method: 'GET', path: `/blog/posts/${ids.draft}/reactions` }),
    expect: { none: notFound, userB: notFound, subB: notFound, agentB: notFound },
  },
  publicRoute('getBlogFeed', 'GET', '/blog/feed'),
  publicRoute('getBlogFeedRss', 'GET', '/blog/feed.xml'),
  { ...publicRoute('listAgentBlogPosts', 'GET', ''), request: () => ({ method: 'GET', path: `/blog/${agentA.name}/posts` }) },
  {
    operationId: 'getAgentBlogPost',
    request: () => ({ method: 'GET', path: `/blog/${agentA.name}/posts/${ids.draftSlug}` }),
    expect: { none: notFound, userB: notFound, subB: notFound, agentB: notFound },
  },
  { ...publicRoute('getAgentBlogRss', 'GET', ''), request: () => ({ method: 'GET', path: `/blog/${agentA.id}/rss` }) },
  { ...publicRoute('getAgentBlogPage', 'GET', ''), request: () => ({ method: 'GET', path: `/@${agentA.name}/blog` }) },
  {
    operationId: 'getAgentBlogPostPage',
    request: () => ({ method: 'GET', path: `/@${agentA.name}/blog/${ids.draftSlug}` }),
    expect: { none: 404, userB: 404, subB: 404, agentB: 404 },
  },
]

function check(res: CallResult, expected: Expected, label: string) {
  const got = `${label}: got ${res.status} ${typeof res.body === 'string' ? res.body.slice(0, 200) : JSON.stringify(res.body)}`
  if (expected === 'ok') {
    if (res.status < 200 || res.status > 299) throw new Error(got)
    return
  }
  const [status, code] = Array.isArray(expected) ? expected : [expected, undefined]
  if (res.status !== status) throw new Error(`expected ${status} ${code ?? ''}, ${got}`)
  if (code !== undefined && (res.body?.success !== false || res.body.error !== code || res.body.statusCode !== status)) {
    throw new Error(`expected the error envelope with ${code}, ${got}`)
  }
}

/** Whichever of A's private values (and with `ownOnly`, A's ids) the answer carries. */
function leaked(res: CallResult, ownOnly = false): string[] {
  const text = typeof res.body === 'string' ? res.body : JSON.stringify(res.body)
  const values = [...Object.values(markers), `${subA.sub}@`, `${ownerA.sub}@`]
  if (ownOnly) values.push(agentA.id, ownerA.id, subA.id, ...Object.values(ids))
  return values.filter(value => text.includes(value))
}

describe('every operation against another tenant’s resources', () => {
  test('the sweep covers every operation of the OpenAPI document', async () => {
    const doc = (await ctx.call('GET', '/swagger/json')).body
    const documented = Object.values<Record<string, { operationId: string }>>(doc.paths).flatMap(ops => Object.values(ops).map(op => op.operationId))
    expect(cases.map(c => c.operationId).sort()).toEqual(documented.sort())
  })

  test('no credential, the wrong kind, another tenant and unknown ids get the contract’s answer, and nothing of A', async () => {
    const failures: string[] = []
    for (const c of cases) {
      for (const who of attackers) {
        const request = c.request(false)
        const res = await ctx.call(request.method, request.path, { ...credentials(who), body: request.body })
        const label = `${c.operationId} (${request.method} ${request.path}) as ${who}`
        try {
          check(res, c.expect[who], label)
        } catch (error) {
          failures.push((error as Error).message)
        }
        const found = leaked(res, c.ownOnly)
        if (found.length > 0) failures.push(`${label} leaked ${found.join(', ')}`)
      }
      if (c.missing !== undefined) {
        // An id that does not exist, as A (the owner, or the agent on agent routes).
        const request = c.request(true)
        const options = request.path.startsWith('/v1/agent/') ? { apiKey: agentA.apiKey } : { token: ownerA.token }
        const res = await ctx.call(request.method, request.path, { ...options, body: request.body })
        try {
          check(res, c.missing, `${c.operationId} with an unknown id`)
        } catch (error) {
          failures.push((error as Error).message)
        }
      }
    }
    expect(failures).toEqual([])
  }, 60_000)

  test('A’s resources read the same afterwards', async () => {
    const read = async (path: string, options: CallOptions) => {
      const res = await ctx.call('GET', path, options)
      expect(res.status).toBe(200)
      return res.body.data
    }
    expect((await read(`/v1/participants/${agentA.id}`, { token: ownerA.token })).settings.blogEnabled).toBe(true)
    expect((await read('/v1/agent/status', { apiKey: agentA.apiKey })).pendingConversations).toBe(1)
    const plans = await read(`/v1/billing/plans/${agentA.id}`, { token: ownerA.token })
    expect(plans.find((p: { id: string }) => p.id === ids.plan)).toMatchObject({ active: true, monthlyPriceCents: 100 })
    const configs = await read(`/v1/billing/configs/${agentA.id}`, { token: ownerA.token })
    expect(configs.find((c: { id: string }) => c.id === ids.config)).toMatchObject({ active: true, priceCents: 5, content: markers.config })
    expect((await read('/v1/billing/subscriptions', { token: subA.token }))[0]).toMatchObject({ id: ids.subscription, status: 'active' })
    expect(await read(`/blog/posts/${ids.draft}`, { token: ownerA.token })).toMatchObject({ status: 'draft', title: markers.draft })
    expect((await read('/v1/connections', { token: subA.token })).map((c: { id: string }) => c.id)).toEqual([ids.connection])
    expect((await read('/v1/auth/api-keys', { token: ownerA.token })).map((k: { id: string }) => k.id)).toContain(ids.apiKey)
    const versions = await read('/v1/context/brand/main/versions', { token: subA.token })
    expect(versions.entries.map((e: { version: number; data: unknown }) => [e.version, e.data])).toEqual([[1, { name: markers.context }]])
    expect(await read(`/v1/agent/service-requests/${ids.request}`, { apiKey: agentA.apiKey })).toMatchObject({ status: 'pending' })
    const poll = await read(`/v1/auth/device-codes/${ids.deviceCode}`, {})
    expect(poll).toMatchObject({ status: 'approved', user: { id: ownerA.id } })
  })
})

describe('credentials, keys and events of one tenant are no use to another', () => {
  test('B’s notification streams carry nothing of A’s', async () => {
    const stream = async (user: TestUser) => {
      const entries = (await ctx.deps.redis.xrange(ctx.deps.keys.events.user(user.id), '-', '+')) as [string, string[]][]
      return entries.map(([, fields]) => fields.join(' ')).join('\n')
    }
    // The relay has moved A's events (the message to A's owner, the reply to A's subscriber) once these show.
    await until(async () => (await stream(ownerA)).includes(markers.message) && (await stream(subA)).includes(markers.reply))
    for (const user of [ownerB, subB]) {
      const text = await stream(user)
      expect(Object.values(markers).filter(value => text.includes(value))).toEqual([])
      expect(text).not.toContain(agentA.id)
    }
  })

  test('an SSE token is no credential anywhere but its stream', async () => {
    for (const options of [{ token: ids.sseToken }, { apiKey: ids.sseToken }]) {
      const res = await ctx.call('GET', '/v1/auth/me', options)
      expect(res.status).toBe(401)
    }
  })

  test('an Idempotency-Key another caller used replays nothing of theirs', async () => {
    const key = `shared-${randomUUID()}`
    const headers = { 'idempotency-key': key }
    const config = { participantId: agentB.id, name: 'C', priceCents: 3, fileType: 'md', content: 'B content' }
    const configId = (await ctx.call('POST', '/v1/billing/configs', { token: ownerB.token, body: config })).body.data.id
    const first = await ctx.call('POST', `/v1/billing/configs/${configId}/purchase`, { token: subA.token, headers })
    const second = await ctx.call('POST', `/v1/billing/configs/${configId}/purchase`, { token: subB.token, headers })
    expect([first.status, second.status]).toEqual([201, 201])
    expect(second.body.data.purchaseId).not.toBe(first.body.data.purchaseId)
    expect(second.body.data.invoiceId).not.toBe(first.body.data.invoiceId)

    const reply = { userId: subA.id, text: 'again' }
    await ctx.call('POST', `/v1/conversations/${agentA.id}/messages`, { token: subA.token, body: { text: 'again?' } })
    const mine = await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agentA.apiKey, body: reply, headers })
    expect(mine.status).toBe(201)
    const theirs = await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agentB.apiKey, body: reply, headers })
    expect([theirs.status, theirs.body.error]).toEqual([404, 'not_found'])

    const chat = { text: 'same key' }
    const a = await ctx.call('POST', '/v1/chat/messages', { token: ownerA.token, body: chat, headers })
    const b = await ctx.call('POST', '/v1/chat/messages', { token: ownerB.token, body: chat, headers })
    expect(b.body.data.author.id).toBe(ownerB.id)
    expect(b.body.data.id).not.toBe(a.body.data.id)
  })
})
