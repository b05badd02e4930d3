/** Who may call what: every billing endpoint against the owner, another user, an agent key and no credential. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import {
  createAgent,
  createTestContext,
  expectError,
  signUp,
  type CallOptions,
  type TestAgent,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'

let ctx: TestContext
let owner: TestUser
let other: TestUser
let agent: TestAgent

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  other = await signUp(ctx)
  agent = await createAgent(ctx, owner)
})
afterAll(() => ctx.close())

type Caller = 'owner' | 'other' | 'agent' | 'none'
type Expected = number | [number, string]

interface Case {
  name: string
  /** Makes fresh resources and returns the request to send. */
  prepare(): Promise<{ method: string; path: string; body?: unknown }>
  expect: Record<Caller, Expected>
}

const credentials = (caller: Caller): CallOptions =>
  caller === 'owner' ? { token: owner.token } : caller === 'other' ? { token: other.token } : caller === 'agent' ? { apiKey: agent.apiKey } : {}

async function newPlan() {
  const res = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'P', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 },
  })
  return res.body.data.id as string
}
async function newConfig() {
  const res = await ctx.call('POST', '/v1/billing/configs', {
    token: owner.token,
    body: { participantId: agent.id, name: 'C', priceCents: 100, fileType: 'md', content: 'x' },
  })
  return res.body.data.id as string
}
/** A fresh agent of the owner with a plan `other` subscribes to, so `other` is a customer. */
async function customerAgent() {
  const fresh = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: fresh.id, name: 'P', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 },
  })
  const sub = await ctx.call('POST', '/v1/billing/subscriptions', { token: other.token, body: { planId: plan.body.data.id } })
  return { agentId: fresh.id, planId: plan.body.data.id as string, subscriptionId: sub.body.data.id as string }
}

const unauthorized: [number, string] = [401, 'unauthorized']
const forbidden: [number, string] = [403, 'forbidden']

const cases: Case[] = [
  {
    name: 'POST /v1/billing/plans',
    prepare: async () => ({
      method: 'POST',
      path: '/v1/billing/plans',
      body: { participantId: agent.id, name: 'P', monthlyPriceCents: 1, includedProxyCalls: 1, overagePerCallCents: 1 },
    }),
    expect: { owner: 201, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/plans/{participantId}',
    prepare: async () => ({ method: 'GET', path: `/v1/billing/plans/${agent.id}` }),
    expect: { owner: 200, other: 200, agent: 200, none: unauthorized },
  },
  {
    name: 'PATCH /v1/billing/plans/{planId}',
    prepare: async () => ({ method: 'PATCH', path: `/v1/billing/plans/${await newPlan()}`, body: { name: 'Q' } }),
    expect: { owner: 200, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'DELETE /v1/billing/plans/{planId}',
    prepare: async () => ({ method: 'DELETE', path: `/v1/billing/plans/${await newPlan()}` }),
    expect: { owner: 200, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'POST /v1/billing/subscriptions',
    prepare: async () => ({ method: 'POST', path: '/v1/billing/subscriptions', body: { planId: await newPlan() } }),
    expect: { owner: [403, 'cannot_subscribe_own_agent'], other: 201, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/subscriptions',
    prepare: async () => ({ method: 'GET', path: '/v1/billing/subscriptions' }),
    expect: { owner: 200, other: 200, agent: forbidden, none: unauthorized },
  },
  {
    name: 'DELETE /v1/billing/subscriptions/{id} (a subscription of `other`)',
    prepare: async () => ({ method: 'DELETE', path: `/v1/billing/subscriptions/${(await customerAgent()).subscriptionId}` }),
    expect: { owner: [404, 'not_found'], other: 200, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/creator-stats',
    prepare: async () => ({ method: 'GET', path: '/v1/billing/creator-stats' }),
    expect: { owner: 200, other: 200, agent: forbidden, none: unauthorized },
  },
  {
    name: 'POST /v1/billing/reviews',
    prepare: async () => ({ method: 'POST', path: '/v1/billing/reviews', body: { participantId: (await customerAgent()).agentId, rating: 5 } }),
    expect: { owner: [403, 'cannot_review_own_agent'], other: 201, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/reviews/{participantId}',
    prepare: async () => ({ method: 'GET', path: `/v1/billing/reviews/${agent.id}` }),
    expect: { owner: 200, other: 200, agent: 200, none: unauthorized },
  },
  {
    name: 'POST /v1/billing/configs',
    prepare: async () => ({
      method: 'POST',
      path: '/v1/billing/configs',
      body: { participantId: agent.id, name: 'C', priceCents: 1, fileType: 'md', content: 'x' },
    }),
    expect: { owner: 201, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/configs/{participantId}',
    prepare: async () => ({ method: 'GET', path: `/v1/billing/configs/${agent.id}` }),
    expect: { owner: 200, other: 200, agent: 200, none: unauthorized },
  },
  {
    name: 'PATCH /v1/billing/configs/{configId}',
    prepare: async () => ({ method: 'PATCH', path: `/v1/billing/configs/${await newConfig()}`, body: { priceCents: 2 } }),
    expect: { owner: 200, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'DELETE /v1/billing/configs/{configId}',
    prepare: async () => ({ method: 'DELETE', path: `/v1/billing/configs/${await newConfig()}` }),
    expect: { owner: 200, other: forbidden, agent: forbidden, none: unauthorized },
  },
  {
    name: 'POST /v1/billing/configs/{configId}/purchase',
    prepare: async () => ({ method: 'POST', path: `/v1/billing/configs/${await newConfig()}/purchase` }),
    expect: { owner: [403, 'cannot_buy_own_config'], other: 201, agent: forbidden, none: unauthorized },
  },
  {
    name: 'GET /v1/billing/my-configs',
    prepare: async () => ({ method: 'GET', path: '/v1/billing/my-configs' }),
    expect: { owner: 200, other: 200, agent: forbidden, none: unauthorized },
  },
]

describe('billing access matrix', () => {
  for (const c of cases) {
    for (const caller of ['owner', 'other', 'agent', 'none'] as const) {
      const expected = c.expect[caller]
      test(`${c.name} as ${caller} → ${Array.isArray(expected) ? expected.join(' ') : expected}`, async () => {
        const request = await c.prepare()
        const res = await ctx.call(request.method, request.path, { ...credentials(caller), body: request.body })
        if (Array.isArray(expected)) {
          const body = expectError(res, expected[0], expected[1])
          if (expected[0] === 401) expect(res.headers.get('www-authenticate')).toStartWith('Bearer')
          expect(body.message.length).toBeGreaterThan(0)
        } else {
          expect(res.status).toBe(expected)
          expect(res.body.success).toBe(true)
        }
      })
    }
  }
})
