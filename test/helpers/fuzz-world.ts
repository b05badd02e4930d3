/** The fuzzer's world: callers with valid credentials, resources to aim at, and makers of fresh ones. */
import { createHmac, randomBytes } from 'node:crypto'
import { createAgent, signUp, subscribedPair, testJwtSecret, userToken, type TestAgent, type TestContext, type TestUser } from './context.ts'
import type { Upstream } from './upstream.ts'
import type { Mutation } from './fuzz-mutations.ts'
import type { Spec } from './fuzz-requests.ts'

export interface World {
  ctx: TestContext
  owner: TestUser
  /** Subscribed to `agent`, with a connected account `acme` and a context entry brand/main. */
  sub: TestUser
  /** The owner's agent: blog on, a plan, a config `sub` bought, a published post and a draft. */
  agent: TestAgent
  /** Another agent of the owner's: what service requests are sent to. */
  target: TestAgent
  planId: string
  configId: string
  postId: string
  postSlug: string
  draftId: string
  requestId: string
  /** Agents, a plan and a config changed by their own update routes only. */
  spare: { agent: TestAgent; planId: string; configId: string }
  fresh: ReturnType<typeof makers>
}

export const as = (user: TestUser) => ({ authorization: `Bearer ${user.token}` })
export const asAgent = (agent: TestAgent) => ({ 'x-api-key': agent.apiKey })

/** A request that must succeed while the world is built. */
export async function must(ctx: TestContext, status: number, method: string, path: string, headers: Record<string, string>, body?: unknown) {
  const res = await ctx.call(method, path, { headers, body })
  if (res.status !== status) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.body)}`)
  return res.body.data
}

export async function buildWorld(ctx: TestContext, upstream: Upstream): Promise<World> {
  const owner = await signUp(ctx)
  const pair = await subscribedPair(ctx, owner)
  const { agent, user: sub } = pair
  const target = await createAgent(ctx, owner)
  const call = (status: number, method: string, path: string, headers: Record<string, string>, body?: unknown) =>
    must(ctx, status, method, path, headers, body)
  await call(200, 'PATCH', `/v1/participants/${agent.id}`, as(owner), { settings: { blogEnabled: true } })
  const config = { participantId: agent.id, name: 'Config', priceCents: 5, fileType: 'md', content: 'content' }
  const configId = (await call(201, 'POST', '/v1/billing/configs', as(owner), config)).id
  await call(201, 'POST', `/v1/billing/configs/${configId}/purchase`, as(sub))
  const post = await call(201, 'POST', '/blog/posts', asAgent(agent), { title: 'Public post', content: 'Text', publish: true })
  const draftId = (await call(201, 'POST', '/blog/posts', asAgent(agent), { title: 'Draft', content: 'Text' })).id
  await call(201, 'POST', '/v1/connections', as(sub), { provider: 'acme', baseUrl: upstream.url, credential: 'secret' })
  await call(200, 'PUT', '/v1/context/brand/main', as(sub), { data: { name: 'Brand' } })
  await call(201, 'POST', `/v1/conversations/${agent.id}/messages`, as(sub), { text: 'Hello' })
  const requestId = (await call(201, 'POST', '/v1/agent/service-requests', asAgent(agent), { targetAgentId: target.id, input: 'x' })).requestId
  const spareAgent = await createAgent(ctx, owner)
  const plan = { participantId: spareAgent.id, name: 'Spare', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 }
  const sparePlan = (await call(201, 'POST', '/v1/billing/plans', as(owner), plan)).id
  const spareConfig = (await call(201, 'POST', '/v1/billing/configs', as(owner), { ...config, participantId: spareAgent.id })).id
  const world: World = {
    ctx,
    owner,
    sub,
    agent,
    target,
    planId: pair.planId,
    configId,
    postId: post.id,
    postSlug: post.slug,
    draftId,
    requestId,
    spare: { agent: spareAgent, planId: sparePlan, configId: spareConfig },
    fresh: undefined as never,
  }
  world.fresh = makers(world)
  return world
}

/** Makers of a resource for one request that uses it up (a delete, a decision, an answer). */
function makers(w: Omit<World, 'fresh'>) {
  const { ctx, owner } = w
  const call = (status: number, method: string, path: string, headers: Record<string, string>, body?: unknown) =>
    must(ctx, status, method, path, headers, body)
  return {
    apiKey: async () => (await call(201, 'POST', '/v1/auth/api-keys', as(owner), { name: 'fuzz' })).id as string,
    device: async () => (await call(201, 'POST', '/v1/auth/device-codes', {})) as { deviceCode: string; userCode: string },
    agent: () => createAgent(ctx, owner),
    plan: async () =>
      (
        await call(201, 'POST', '/v1/billing/plans', as(owner), {
          participantId: w.agent.id,
          name: 'P',
          monthlyPriceCents: 1,
          includedProxyCalls: 1,
          overagePerCallCents: 1,
        })
      ).id as string,
    subscription: async () => {
      const user = await signUp(ctx)
      return { user, id: (await call(201, 'POST', '/v1/billing/subscriptions', as(user), { planId: w.planId })).id as string }
    },
    config: async () =>
      (
        await call(201, 'POST', '/v1/billing/configs', as(owner), {
          participantId: w.agent.id,
          name: 'C',
          priceCents: 1,
          fileType: 'md',
          content: 'c',
        })
      ).id as string,
    /** A service request to a new agent (one target holds a quarter of its open requests from one sender), and that agent. */
    request: async () => {
      const target = await createAgent(ctx, owner)
      const created = await call(201, 'POST', '/v1/agent/service-requests', asAgent(w.agent), { targetAgentId: target.id, input: 'x' })
      return { requestId: created.requestId as string, target }
    },
    connection: async (baseUrl: string) =>
      (await call(201, 'POST', '/v1/connections', as(w.sub), { provider: `p${randomBytes(4).toString('hex')}`, baseUrl, credential: 'c' }))
        .id as string,
    post: async () => (await call(201, 'POST', '/blog/posts', asAgent(w.agent), { title: 'Gone soon', content: 'Text' })).id as string,
  }
}

/** A JWT signed with the test secret, whatever its header and claims say (jose signs only what it would accept). */
const jwt = (claims: Record<string, unknown>, header: Record<string, unknown> = { alg: 'HS256' }) => {
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const signed = `${part(header)}.${part(claims)}`
  return `${signed}.${createHmac('sha256', testJwtSecret).update(signed).digest('base64url')}`
}
const now = () => Math.floor(Date.now() / 1000)

/** Credentials of odd shapes, in either header: each replaces the case's own. */
export async function credentialMutations(w: World): Promise<Mutation[]> {
  const fresh = () => `fuzz-${randomBytes(4).toString('hex')}`
  const unsigned = (claims: object) =>
    `${Buffer.from('{"alg":"none"}').toString('base64url')}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.`
  const shapes: [string, Record<string, string>][] = [
    ['no credential', {}],
    ['Bearer alone', { authorization: 'Bearer' }],
    ['Bearer and spaces', { authorization: 'Bearer    ' }],
    ['lower-case bearer', { authorization: `bearer ${w.owner.token}` }],
    ['two tokens', { authorization: `Bearer ${w.owner.token} ${w.owner.token}` }],
    ['Basic', { authorization: 'Basic dXNlcjpwYXNz' }],
    ['long token', { authorization: `Bearer ${'a'.repeat(12_000)}` }],
    ['latin-1 token', { authorization: 'Bearer \u00e9\u00ff' }],
    ['bad checksum user key', { authorization: `Bearer sk_usr_${'A'.repeat(38)}` }],
    ['agent key as bearer', { authorization: `Bearer ${w.agent.apiKey}` }],
    ['three dots', { authorization: 'Bearer a.b.c' }],
    ['alg none', { authorization: `Bearer ${unsigned({ sub: fresh(), exp: now() + 60 })}` }],
    ['expired', { authorization: `Bearer ${await userToken(w.owner.sub, {}, { expiresIn: '-2h' })}` }],
    ['no exp', { authorization: `Bearer ${jwt({ sub: fresh() })}` }],
    ['exp far away', { authorization: `Bearer ${jwt({ sub: fresh(), exp: 8.64e15 })}` }],
    ['exp a string', { authorization: `Bearer ${jwt({ sub: fresh(), exp: 'soon' })}` }],
    ['iat in the future', { authorization: `Bearer ${jwt({ sub: fresh(), iat: now() + 3600, exp: now() + 3700 })}` }],
    ['sub 255 characters', { authorization: `Bearer ${jwt({ sub: 's'.repeat(255), exp: now() + 600 })}` }],
    ['sub of emoji', { authorization: `Bearer ${jwt({ sub: '😀'.repeat(200), exp: now() + 600 })}` }],
    ['sub a number', { authorization: `Bearer ${jwt({ sub: 12345, exp: now() + 600 })}` }],
    ['sub with NUL', { authorization: `Bearer ${jwt({ sub: 'a\u0000b', exp: now() + 600 })}` }],
    ['sub a lone surrogate', { authorization: `Bearer ${jwt({ sub: 'a\ud800', exp: now() + 600 })}` }],
    ['odd claims', { authorization: `Bearer ${jwt({ sub: fresh(), exp: now() + 600, email: { a: 1 }, wallet_address: 7 })}` }],
    ['odd email', { authorization: `Bearer ${jwt({ sub: fresh(), exp: now() + 600, email: `${'e'.repeat(400)}@x\u0000` })}` }],
    ['odd wallet', { authorization: `Bearer ${jwt({ sub: fresh(), exp: now() + 600, wallet_address: '0xZZ\u202e' })}` }],
    ['unknown kid and alg', { authorization: `Bearer ${jwt({ sub: fresh(), exp: now() + 600 }, { alg: 'HS256', kid: '../../x', crit: ['x'] })}` }],
    ['X-API-Key empty', { 'x-api-key': '' }],
    ['X-API-Key a user key', { 'x-api-key': `sk_usr_${'B'.repeat(38)}` }],
    ['X-API-Key bad checksum', { 'x-api-key': `sk_agt_${'C'.repeat(38)}` }],
    ['X-API-Key padded', { 'x-api-key': `  ${w.agent.apiKey}  ` }],
    ['X-API-Key long', { 'x-api-key': `sk_agt_${'d'.repeat(12_000)}` }],
    ['both headers', { authorization: `Bearer ${w.owner.token}`, 'x-api-key': w.agent.apiKey }],
  ]
  const accepted = ['lower-case bearer', 'agent key as bearer', 'sub 255 characters', 'sub of emoji', 'odd claims', 'odd email', 'odd wallet']
  return shapes.map(([label, headers]) => ({
    label: `credential ${label}`,
    where: 'credential' as const,
    refused: !accepted.includes(label) && !label.startsWith('X-API-Key padded') && label !== 'both headers',
    apply: (spec: Spec) => {
      const rest = Object.fromEntries(Object.entries(spec.headers).filter(([name]) => name !== 'authorization' && name !== 'x-api-key'))
      return [{ ...spec, headers: { ...rest, ...headers } }]
    },
  }))
}
