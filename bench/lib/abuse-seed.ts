/** The abuse bench's accounts: well-behaved agents with a subscriber each, and the attacker's users and agent. */
import { randomUUID } from 'node:crypto'
import { SignJWT } from 'jose'
import { generateKey } from '../../src/auth/api-key.ts'
import type { Sql } from '../../src/db.ts'
import { seedAgents } from './seed-agents.ts'

export interface WellBehavedAgent {
  id: string
  key: string
  /** The agent's one subscriber, who writes to it now and then. */
  userId: string
  userToken: string
}

export interface Attacker {
  /** Owns the attacker's agent; creates agents and guesses device codes. */
  ownerToken: string
  agentId: string
  agentKey: string
  /** Subscribes to the attacker's agent (and connects the slow upstream) and to a well-behaved agent it floods with messages. */
  subscriberId: string
  subscriberToken: string
  /** Subscribed to the attacker's agent, wrote to it, was answered, then unsubscribed. */
  lapsedId: string
}

export interface AbuseAccounts {
  agents: WellBehavedAgent[]
  attacker: Attacker
}

/** How many well-behaved agents seedAgents gives a subscriber of their own (it seeds 100 users). */
export const wellBehavedAgents = 100

/** A user's token as the service's identity provider would sign it (HS256, an hour). */
export function userToken(jwtSecret: string, providerId: string): Promise<string> {
  return new SignJWT({ email: `${providerId}@bench.local` })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(providerId)
    .setIssuedAt()
    .setExpirationTime('1h')
    .sign(new TextEncoder().encode(jwtSecret))
}

/**
 * 100 agents, each with one subscriber (seedAgents: user i, `bench-user-i`, subscribes to agent i)
 * and a conversation waiting for its reply; then the attacker's accounts, set-based.
 */
export async function seedAbuseAccounts(sql: Sql, jwtSecret: string): Promise<AbuseAccounts> {
  const seeded = await seedAgents(sql, { agents: wellBehavedAgents, pendingEvery: 1, repliers: wellBehavedAgents })
  const agents = await Promise.all(
    seeded.map(async (agent, i) => ({
      id: agent.id,
      key: agent.key,
      userId: agent.userId!,
      userToken: await userToken(jwtSecret, `bench-user-${i}`),
    })),
  )
  const attacker = await seedAttacker(sql, jwtSecret, agents[1]!.id)
  return { agents, attacker }
}

/** The attacker: an owner, an agent with a key and a plan, an active subscriber (also to `floodedAgentId`) and a lapsed one. */
async function seedAttacker(sql: Sql, jwtSecret: string, floodedAgentId: string): Promise<Attacker> {
  const [ownerId, subscriberId, lapsedId, agentId] = [randomUUID(), randomUUID(), randomUUID(), randomUUID()]
  const { key, hash, prefix } = generateKey('agent')
  const now = Date.now()
  const askedAt = new Date(now - 120_000)
  const answeredAt = new Date(now - 90_000)
  const cancelledAt = new Date(now - 60_000)
  await sql.begin(async tx => {
    await tx`
      insert into users (id, provider_id)
      values (${ownerId}, 'abuse-owner'), (${subscriberId}, 'abuse-subscriber'), (${lapsedId}, 'abuse-lapsed')
    `
    await tx`insert into participants (id, owner_id, name, display_name) values (${agentId}, ${ownerId}, 'abuse-agent', 'Abuse agent')`
    await tx`insert into api_keys (kind, participant_id, name, prefix, key_hash) values ('agent', ${agentId}, 'bench', ${prefix}, ${hash})`
    const [plan] = await tx<{ id: string }[]>`
      insert into plans (participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
      values (${agentId}, 'Abuse', 1000, 1000, 1, ${askedAt}, ${askedAt})
      returning id
    `
    await tx`
      insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
      values (${plan!.id}, ${askedAt}, 1000, 1000, 1)
    `
    await tx`
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at, cancelled_at)
      values
        (${subscriberId}, ${agentId}, ${plan!.id}, 'active', ${askedAt}, ${askedAt}, null),
        (${lapsedId}, ${agentId}, ${plan!.id}, 'cancelled', ${askedAt}, ${askedAt}, ${cancelledAt})
    `
    await tx`
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select ${subscriberId}, participant_id, id, 'active', ${askedAt}, ${askedAt} from plans where participant_id = ${floodedAgentId}
    `
    // Both wrote to the attacker's agent while subscribed and were answered.
    await tx`
      insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, latest_reply_at, pending_count)
      select ${agentId}, u, 'Hello?', ${askedAt}, ${answeredAt}, 0 from unnest(${[subscriberId, lapsedId]}::uuid[]) as t (u)
    `
    await tx`
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select gen_random_uuid(), ${agentId}, u, role, text, at
      from unnest(${[subscriberId, lapsedId]}::uuid[]) as t (u),
        (values ('user', 'Hello?', ${askedAt}::timestamptz), ('agent', 'Hello.', ${answeredAt}::timestamptz)) as m (role, text, at)
    `
  })
  return {
    ownerToken: await userToken(jwtSecret, 'abuse-owner'),
    agentId,
    agentKey: key,
    subscriberId,
    subscriberToken: await userToken(jwtSecret, 'abuse-subscriber'),
    lapsedId,
  }
}
