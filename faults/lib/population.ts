/** The marketplace a scenario loads: pairs of an owner's agent (with a plan) and a subscriber with a connected account. */
import { randomBytes } from 'node:crypto'
import { SignJWT } from 'jose'
import type { Client } from './http-client.ts'

export interface Person {
  id: string
  token: string
}

export interface Pair {
  index: number
  owner: Person
  agent: { id: string; name: string; apiKey: string }
  user: Person
  planId: string
  subscriptionId: string
}

/** An HS256 JWT as an identity provider would issue it; the user's first one creates them. */
export async function signIn(client: Client, secret: string, sub: string): Promise<Person> {
  const token = await userToken(secret, sub)
  const me = await client.call('setup', 'GET', '/v1/auth/me', { token })
  return { id: expectStatus(me, 200, 'sign-in').data.id, token }
}

export function userToken(secret: string, sub: string): Promise<string> {
  return new SignJWT({ email: `${sub}@example.com` })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime('2h')
    .sign(new TextEncoder().encode(secret))
}

function expectStatus(attempt: { status?: number; error?: string; body?: any }, status: number, what: string) {
  if (attempt.status !== status)
    throw new Error(`${what} failed before any fault: ${attempt.status ?? attempt.error} ${JSON.stringify(attempt.body)}`)
  return attempt.body
}

export async function createPairs(client: Client, secret: string, upstreamUrl: string, count: number): Promise<Pair[]> {
  return Promise.all(
    Array.from({ length: count }, async (_, index) => {
      const tag = randomBytes(4).toString('hex')
      const owner = await signIn(client, secret, `owner-${index}-${tag}`)
      const created = await client.call('setup', 'POST', '/v1/participants', { token: owner.token, body: { name: `fault-agent-${index}-${tag}` } })
      const agent = expectStatus(created, 201, 'agent creation').data
      const plan = await client.call('setup', 'POST', '/v1/billing/plans', {
        token: owner.token,
        body: { participantId: agent.id, name: 'Faults', monthlyPriceCents: 100, includedProxyCalls: 100_000, overagePerCallCents: 1 },
      })
      const planId = expectStatus(plan, 201, 'plan creation').data.id
      const user = await signIn(client, secret, `user-${index}-${tag}`)
      const subscribed = await client.call('setup', 'POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
      const subscriptionId = expectStatus(subscribed, 201, 'subscription').data.id
      const connection = await client.call('setup', 'POST', '/v1/connections', {
        token: user.token,
        body: { provider: 'acme', baseUrl: `${upstreamUrl}/api`, credential: `upstream-secret-${tag}` },
      })
      expectStatus(connection, 201, 'connection')
      return { index, owner, agent: { id: agent.id, name: agent.name, apiKey: agent.apiKey }, user, planId, subscriptionId }
    }),
  )
}
