/**
 * A schema-driven fuzzer of the whole HTTP API, from the service's own OpenAPI document: every
 * operation is sent a valid request and its mutations (each body property missing, null, of the wrong
 * type, on and past its limits, odd strings and numbers; odd path parameters, query parameters and
 * headers; odd credentials; bodies where none is taken, and bodies sent chunked; the path under
 * methods it does not take; the same request several times at once; random valid values; several
 * mutations at once). Each answer must be under 500, a documented status, a 4xx in the contract's
 * envelope with a code of its status's family, a 2xx body of its documented schema; a request the
 * document calls invalid must not succeed, nor one it calls valid be refused as not JSON; a wrong
 * method must be refused; and a sample of refused writes must leave every table, and the agents'
 * inboxes, as they were.
 *
 * FUZZ_SEED replays a run (the seed is printed); FUZZ_ITERATIONS sets the random rounds per operation
 * (a longer hunt: 40 take about a minute); FUZZ_SNAPSHOTS the share of refused writes read back;
 * FUZZ_WIRE=1 sends over a socket to the app listening; FUZZ_VERBOSE=1 prints each operation's count
 * of requests and of successes (an operation that seldom succeeds is seldom tested past its checks)
 * and what the service refuses that the document allows.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import SwaggerParser from '@apidevtools/swagger-parser'
import { createTestContext, signUp, testRateLimits, type TestContext } from './helpers/context.ts'
import { startUpstream, type Upstream } from './helpers/upstream.ts'
import { documentOracle } from './helpers/fuzz-oracle.ts'
import type { Mutation } from './helpers/fuzz-mutations.ts'
import { fuzzAll, type Build, type Finding } from './helpers/fuzz-run.ts'
import { as, asAgent, buildWorld, credentialMutations, type World } from './helpers/fuzz-world.ts'
import { seeded } from './helpers/seeded.ts'
import { serverOptions } from '../src/http/server-options.ts'

const seed = Number(process.env.FUZZ_SEED ?? 20261128)
const iterations = Number(process.env.FUZZ_ITERATIONS ?? 2)
const snapshotShare = Number(process.env.FUZZ_SNAPSHOTS ?? 0.1)
const verbose = Boolean(process.env.FUZZ_VERBOSE)

let ctx: TestContext
let upstream: Upstream
let w: World
let oracle: ReturnType<typeof documentOracle>
let credentials: Mutation[]
let origin: string | undefined

beforeAll(async () => {
  // A user's misses of device codes are limited (10 an hour): the fuzzer's odd codes would spend them, and refuse every later decision.
  const rateLimits = JSON.stringify({ ...testRateLimits, deviceCodeMisses: { capacity: 10000, perSeconds: 1 } })
  ctx = await createTestContext({ actors: true, env: { PROXY_ALLOWED_HOSTS: '127.0.0.1', RATE_LIMITS: rateLimits } })
  upstream = startUpstream()
  w = await buildWorld(ctx, upstream)
  oracle = documentOracle(await SwaggerParser.dereference((await ctx.call('GET', '/swagger/json')).body))
  credentials = await credentialMutations(w)
  if (process.env.FUZZ_WIRE) origin = `http://127.0.0.1:${ctx.app.listen({ port: 0, ...serverOptions(ctx.deps.log) }).server!.port}`
}, 60_000)
afterAll(async () => {
  if (origin) await ctx.app.stop(true)
  upstream.stop()
  await ctx.close()
})

const spec = (params: Record<string, string>, headers: Record<string, string>, rest: Partial<Build> = {}): Build => ({
  params,
  headers,
  query: [],
  ...rest,
})
const q = (...pairs: [string, string][]): [string, string][] => pairs.map(([name, value]) => [name, encodeURIComponent(value)])
const none = {}
/** A name no earlier request took (every run has a database of its own). */
let names = 0
const unique = (prefix: string) => `${prefix}${++names}`
const later = () => new Date(Date.now() + 3_600_000).toISOString()

/** The valid request of each operation (fresh resources for those a request uses up). */
const cases: Record<string, () => Build | Promise<Build>> = {
  health: () => spec({}, none),
  healthV1: () => spec({}, none),
  healthLive: () => spec({}, none),
  healthReady: () => spec({}, none),
  getProfile: () => spec({}, as(w.sub)),
  updateProfile: () => spec({}, as(w.sub), { body: { walletAddress: '0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed' } }),
  createApiKey: () => spec({}, as(w.owner), { body: { name: 'key' } }),
  listApiKeys: () => spec({}, as(w.owner)),
  revokeApiKey: async () => spec({ id: await w.fresh.apiKey() }, as(w.owner)),
  startDeviceAuthorization: () => spec({}, none),
  pollDeviceAuthorization: async () => spec({ code: (await w.fresh.device()).deviceCode }, none),
  decideDeviceAuthorization: async () => spec({ code: (await w.fresh.device()).userCode }, as(w.sub), { body: { action: 'approve' } }),
  issueSseToken: () => spec({}, as(w.sub)),
  devicePage: () => spec({}, none, { query: q(['user_code', 'BCDF-GHJK']) }),
  createParticipant: () => spec({}, as(w.owner), { body: { name: unique('fz-'), displayName: 'Fuzz', description: 'An agent' } }),
  listMyParticipants: () => spec({}, as(w.owner)),
  getParticipant: () => spec({ id: w.agent.id }, none),
  updateParticipant: () =>
    spec({ id: w.spare.agent.id }, as(w.owner), {
      body: { displayName: 'Spare', description: 'd', settings: { blogEnabled: true, blogAutoPublish: false } },
    }),
  deactivateParticipant: async () => spec({ id: (await w.fresh.agent()).id }, as(w.owner)),
  rotateParticipantKey: () => spec({ id: w.spare.agent.id }, as(w.owner)),
  createPlan: () =>
    spec({}, as(w.owner), {
      body: { participantId: w.agent.id, name: 'Plan', description: 'd', monthlyPriceCents: 100, includedProxyCalls: 10, overagePerCallCents: 1 },
    }),
  listPlans: () => spec({ id: w.agent.id }, as(w.sub)),
  updatePlan: () =>
    spec({ id: w.spare.planId }, as(w.owner), {
      body: { name: 'Spare', description: 'd', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    }),
  deactivatePlan: async () => spec({ id: await w.fresh.plan() }, as(w.owner)),
  subscribe: async () => {
    const [user, planId] = await Promise.all([signUp(ctx), w.fresh.plan()])
    return spec({}, as(user), {
      body: { planId, expectedTerms: { monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 } },
    })
  },
  listSubscriptions: () => spec({}, as(w.sub), { query: q(['limit', '10'], ['before', later()]) }),
  cancelSubscription: async () => {
    const { user, id } = await w.fresh.subscription()
    return spec({ id }, as(user))
  },
  writeReview: () => spec({}, as(w.sub), { body: { participantId: w.agent.id, rating: 4, comment: 'Good' } }),
  listReviews: () => spec({ participantId: w.agent.id }, as(w.sub), { query: q(['limit', '10'], ['before', later()]) }),
  createConfig: () =>
    spec({}, as(w.owner), {
      body: { participantId: w.agent.id, name: 'C', description: 'd', priceCents: 5, fileType: 'md', content: 'c', previewSnippet: 'p' },
    }),
  listConfigs: () => spec({ id: w.agent.id }, as(w.sub)),
  updateConfig: () =>
    spec({ id: w.spare.configId }, as(w.owner), {
      body: { name: 'C', description: 'd', priceCents: 5, fileType: 'md', content: 'c', previewSnippet: 'p' },
    }),
  deactivateConfig: async () => spec({ id: await w.fresh.config() }, as(w.owner)),
  purchaseConfig: async () => spec({ id: await w.fresh.config() }, as(w.sub), { body: { expectedPriceCents: 1 } }),
  listMyConfigs: () => spec({}, as(w.sub)),
  creatorStats: () => spec({}, as(w.owner)),
  sendMessage: () => spec({ agentId: w.agent.id }, as(w.sub), { body: { text: 'Hello' } }),
  listMessages: () => spec({ agentId: w.agent.id }, as(w.sub), { query: q(['limit', '10'], ['before', later()]) }),
  replyToConversation: () => spec({}, asAgent(w.agent), { body: { userId: w.sub.id, text: 'Hi' } }),
  pollAgentEvents: () => spec({}, asAgent(w.agent), { query: q(['since', '2026-01-01T00:00:00.000Z']) }),
  agentStatus: () => spec({}, asAgent(w.agent)),
  createServiceRequest: async () =>
    spec({}, asAgent(w.agent), { body: { targetAgentId: (await w.fresh.agent()).id, serviceTag: 'tag', input: 'in' } }),
  getServiceRequest: () => spec({ requestId: w.requestId }, asAgent(w.agent)),
  respondToServiceRequest: async () => {
    const { requestId, target } = await w.fresh.request()
    return spec({}, asAgent(target), { body: { requestId, output: 'out', success: true } })
  },
  readContextAsAgent: () => spec({}, asAgent(w.agent), { query: q(['userId', w.sub.id], ['type', 'brand'], ['key', 'main']) }),
  writeContextAsAgent: () =>
    spec({}, asAgent(w.agent), {
      body: { userId: w.sub.id, type: 'custom', key: 'agent-note', data: { a: 1 }, confidence: 'derived', source: { method: 'fuzz' } },
    }),
  proxyCall: () =>
    spec({}, asAgent(w.agent), {
      body: { userId: w.sub.id, provider: 'acme', method: 'POST', path: '/echo', query: { a: 1 }, headers: { 'x-a': 'b' }, body: { c: 1 } },
    }),
  readContext: () => spec({}, as(w.sub), { query: q(['type', 'brand'], ['key', 'main']) }),
  listContextVersions: () => spec({ type: 'brand', key: 'main' }, as(w.sub)),
  writeContext: () => spec({ type: 'custom', key: 'user-note' }, as(w.sub), { body: { data: { a: 1 } } }),
  revertContext: () => spec({ type: 'brand', key: 'main' }, as(w.sub), { body: { version: 1 } }),
  listInvoices: () => spec({}, as(w.sub), { query: q(['limit', '10'], ['before', later()]) }),
  createConnection: () =>
    spec({}, as(w.sub), {
      body: { provider: unique('p'), baseUrl: `${upstream.url}/api`, credential: 'tok', label: 'L' },
    }),
  listConnections: () => spec({}, as(w.sub)),
  deleteConnection: async () => spec({ id: await w.fresh.connection(upstream.url) }, as(w.sub)),
  notificationStream: () => spec({}, as(w.owner)),
  chatStream: () => spec({}, none),
  postChatMessage: () => spec({}, as(w.sub), { body: { text: 'Hello world' } }),
  listChatMessages: () => spec({}, as(w.sub), { query: q(['limit', '10'], ['before', later()]) }),
  createBlogPost: () =>
    spec({}, as(w.owner), { body: { participantId: w.agent.id, title: 'Title', content: 'Text', excerpt: 'E', tags: ['t'], publish: false } }),
  getBlogPost: () => spec({ postId: w.draftId }, as(w.owner)),
  updateBlogPost: () => spec({ postId: w.draftId }, asAgent(w.agent), { body: { title: 'Draft', content: 'Text', excerpt: 'E', tags: ['t'] } }),
  deleteBlogPost: async () => spec({ postId: await w.fresh.post() }, asAgent(w.agent)),
  listManagedBlogPosts: () => spec({ agentId: w.agent.id }, as(w.owner), { query: q(['limit', '10'], ['status', 'draft'], ['before', later()]) }),
  reactToBlogPost: () => spec({ postId: w.postId }, as(w.sub), { body: { type: 'like' } }),
  getBlogPostReactions: () => spec({ postId: w.postId }, none),
  removeBlogPostReaction: () => spec({ postId: w.postId }, as(w.sub), { body: { type: 'insightful' } }),
  getBlogFeed: () => spec({}, none, { query: q(['limit', '10'], ['offset', '0'], ['tag', 't']) }),
  getBlogFeedRss: () => spec({}, none),
  listAgentBlogPosts: () => spec({ agentIdOrName: w.agent.name }, none, { query: q(['limit', '10'], ['offset', '0']) }),
  getAgentBlogPost: () => spec({ agentIdOrName: w.agent.name, slug: w.postSlug }, none),
  getAgentBlogRss: () => spec({ agentIdOrName: w.agent.id }, none),
  getAgentBlogPage: () => spec({ name: w.agent.name }, none, { query: q(['page', '1']) }),
  getAgentBlogPostPage: () => spec({ name: w.agent.name, slug: w.postSlug }, none),
}

/** One line per kind of finding: the operation, the problem, how often, and the first request that showed it. */
function report(findings: Finding[]): string[] {
  const grouped = new Map<string, Finding[]>()
  for (const finding of findings) {
    const key = `${finding.operationId}: ${finding.problem.replace(/\d+/g, 'N')}`
    grouped.set(key, [...(grouped.get(key) ?? []), finding])
  }
  return [...grouped].map(([key, [first, ...more]]) => `${key} (${more.length + 1}x; e.g. ${first!.label}: ${first!.seen})`)
}

describe('the API under schema-driven fuzzing', () => {
  test('every operation of the OpenAPI document has a case', () => {
    expect(Object.keys(cases).sort()).toEqual(oracle.operations.map(op => op.operationId).sort())
  })

  test('no 5xx; every answer documented, in its envelope and of its schema; nothing refused changed', async () => {
    const where = origin ? `over the wire to ${origin}` : 'in process'
    console.log(`fuzz: seed ${seed} (replay with FUZZ_SEED=${seed}), ${iterations} random rounds per operation, ${where}`)
    const run = { ctx, oracle, world: w, cases, credentials, random: seeded(seed), iterations, snapshotShare, origin }
    const outcome = await fuzzAll(
      run,
      verbose
        ? (operationId, { sent, succeeded, random }) =>
            console.log(`${operationId}: ${sent} requests, ${succeeded} succeeded; random valid bodies ${random.succeeded} of ${random.sent}`)
        : undefined,
    )
    if (verbose) console.log(`refused though the document allows them:\n${[...outcome.stricter].join('\n')}`)
    console.log(`fuzz: ${outcome.sent} requests to ${oracle.operations.length} operations, ${outcome.findings.length} findings`)
    expect(report(outcome.findings)).toEqual([])
  }, 600_000)
})
