/**
 * A client's walk through the API, written against the types openapi-typescript generates from the
 * live document (`./api.ts`, made by test/openapi-client.test.ts beside a copy of this file, where
 * both are compiled with tsc and this is run). Not part of `npm run typecheck`: api.ts exists only there.
 */
import createClient from 'openapi-fetch'
import type { components, paths } from './api.ts'

type Schemas = components['schemas']

export interface Walked {
  profile: Schemas['UserProfile']
  agent: Schemas['CreatedParticipant']
  plan: Schemas['Plan']
  plans: Schemas['Plan'][]
  subscription: Schemas['Subscription']
  refused: Schemas['ErrorEnvelope']
  message: Schemas['Message']
  events: Schemas['AgentEvents']
  reply: Schemas['Reply']
  purchase: Schemas['Purchase']
  invoices: Schemas['Invoice'][]
  draft: Schemas['Post']
  published: Schemas['Post']
}

/** The payload of a success, or an error naming the failure: every call here is meant to succeed. */
function data<T>(result: { data?: { success: true; data: T }; error?: unknown; response: Response }): T {
  if (!result.data) throw new Error(`${result.response.status} from ${result.response.url}: ${JSON.stringify(result.error)}`)
  return result.data.data
}

/**
 * Owner and subscriber sign in with their tokens; the owner creates an agent and a plan, the
 * subscriber subscribes and writes, the agent polls and replies, the subscriber buys a config and
 * reads the invoices, and the agent writes and publishes a blog post.
 */
export async function walk(baseUrl: string, tokens: { owner: string; subscriber: string }, name: string): Promise<Walked> {
  const owner = createClient<paths>({ baseUrl, headers: { authorization: `Bearer ${tokens.owner}` } })
  const subscriber = createClient<paths>({ baseUrl, headers: { authorization: `Bearer ${tokens.subscriber}` } })

  const profile = data(await subscriber.GET('/v1/auth/me'))
  const agent = data(await owner.POST('/v1/participants', { body: { name, displayName: 'Walked Agent' } }))
  const plan = data(
    await owner.POST('/v1/billing/plans', {
      body: { participantId: agent.id, name: 'Pro', monthlyPriceCents: 900, includedProxyCalls: 100, overagePerCallCents: 1 },
    }),
  )
  const plans = data(await subscriber.GET('/v1/billing/plans/{id}', { params: { path: { id: agent.id } } }))
  const subscription = data(
    await subscriber.POST('/v1/billing/subscriptions', {
      params: { header: { 'idempotency-key': `subscribe-${name}` } },
      body: { planId: plan.id },
    }),
  )
  // A second subscription is refused, and the failure is typed as the envelope.
  const again = await subscriber.POST('/v1/billing/subscriptions', { body: { planId: plan.id } })
  if (!again.error) throw new Error('a second subscription was accepted')
  const refused: Schemas['ErrorEnvelope'] = again.error

  const message = data(
    await subscriber.POST('/v1/conversations/{agentId}/messages', { params: { path: { agentId: agent.id } }, body: { text: 'Hello, agent' } }),
  )
  const self = createClient<paths>({ baseUrl, headers: { 'x-api-key': agent.apiKey } })
  const events = data(await self.GET('/v1/agent/events'))
  const pending = events.pendingConversations.find(conversation => conversation.userId === profile.id)
  if (!pending) throw new Error('the agent does not see the message')
  const reply = data(await self.POST('/v1/agent/conversation-reply', { body: { userId: pending.userId, text: 'Hello, subscriber' } }))

  const listing = data(
    await owner.POST('/v1/billing/configs', {
      body: { participantId: agent.id, name: 'Rules', priceCents: 300, fileType: '.cursorrules', content: 'Be brief.' },
    }),
  )
  const purchase = data(await subscriber.POST('/v1/billing/configs/{id}/purchase', { params: { path: { id: listing.id } } }))
  const invoices = data(await subscriber.GET('/v1/billing/invoices', { params: { query: { limit: 10 } } }))

  data(await owner.PATCH('/v1/participants/{id}', { params: { path: { id: agent.id } }, body: { settings: { blogEnabled: true } } }))
  const draft = data(
    await self.POST('/blog/posts', { body: { title: 'Walked Through', content: 'A post *written* by a generated client.', tags: ['client'] } }),
  )
  const published = data(await self.PATCH('/blog/posts/{postId}', { params: { path: { postId: draft.id } }, body: { status: 'published' } }))

  return { profile, agent, plan, plans, subscription, refused, message, events, reply, purchase, invoices, draft, published }
}
