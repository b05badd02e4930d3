/** Agents for the poll and the replies, set-based: one key each (SHA-256 stored, plaintext kept here), conversations, messages. */
import { randomUUID } from 'node:crypto'
import { generateKey } from '../../src/auth/api-key.ts'
import type { Sql } from '../../src/db.ts'
import { skipForeignKeyChecks } from './bulk.ts'

export interface SeededAgent {
  id: string
  key: string
  /** The user whose conversation with this agent exists (pending or answered), if any. */
  userId: string | null
  pending: boolean
}

export interface SeedOptions {
  agents: number
  /** Every n-th agent has a pending conversation (100: 1 %). */
  pendingEvery: number
  /** The first n agents have a conversation to reply to. */
  repliers: number
}

const owners = 100
const subscribers = 100

export async function seedAgents(sql: Sql, options: SeedOptions): Promise<SeededAgent[]> {
  const ownerIds = Array.from({ length: owners }, () => randomUUID())
  const userIds = Array.from({ length: subscribers }, () => randomUUID())
  const agents: SeededAgent[] = []
  const keys: { hash: string; prefix: string }[] = []
  for (let i = 0; i < options.agents; i++) {
    const { key, hash, prefix } = generateKey('agent')
    const pending = i % options.pendingEvery === 0
    const talks = pending || i < options.repliers
    agents.push({ id: randomUUID(), key, userId: talks ? userIds[i % subscribers]! : null, pending })
    keys.push({ hash: hash.toString('hex'), prefix })
  }
  const talking = agents.filter(agent => agent.userId !== null)
  const now = Date.now()
  const askedAt = new Date(now - 60_000)
  const answeredAt = new Date(now - 30_000)

  await sql.begin(async tx => {
    await skipForeignKeyChecks(tx)
    const people = [...ownerIds, ...userIds]
    const providers = [...ownerIds.map((_, i) => `bench-owner-${i}`), ...userIds.map((_, i) => `bench-user-${i}`)]
    await tx`insert into users (id, provider_id) select * from unnest(${people}::uuid[], ${providers}::text[])`
    await tx`
      insert into participants (id, owner_id, name, display_name)
      select id, owner_id, name, 'Bench agent ' || name
      from unnest(${agents.map(a => a.id)}::uuid[], ${agents.map((_, i) => ownerIds[i % owners]!)}::uuid[],
        ${agents.map((_, i) => `bench-agent-${i}`)}::text[]) as t (id, owner_id, name)
    `
    await tx`
      insert into api_keys (kind, participant_id, name, prefix, key_hash)
      select 'agent', participant_id, 'bench', prefix, decode(hash, 'hex')
      from unnest(${agents.map(a => a.id)}::uuid[], ${keys.map(k => k.prefix)}::text[], ${keys.map(k => k.hash)}::text[])
        as t (participant_id, prefix, hash)
    `
    await tx`
      insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, latest_reply_at, pending_count)
      select participant_id, user_id, 'Could you summarise yesterday''s report?', ${askedAt},
        case when pending = 1 then null else ${answeredAt}::timestamptz end, pending
      from unnest(${talking.map(a => a.id)}::uuid[], ${talking.map(a => a.userId!)}::uuid[], ${talking.map(a => (a.pending ? 1 : 0))}::int[])
        as t (participant_id, user_id, pending)
    `
    await tx`
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select gen_random_uuid(), participant_id, user_id, 'user', 'Could you summarise yesterday''s report?', ${askedAt}
      from unnest(${talking.map(a => a.id)}::uuid[], ${talking.map(a => a.userId!)}::uuid[]) as t (participant_id, user_id)
    `
    // Each talking agent's user subscribes to it (an agent writes only to its subscribers, or answers a waiting message).
    await tx`
      insert into plans (participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
      select id, 'Bench', 1000, 1000, 1, ${askedAt}, ${askedAt} from unnest(${talking.map(a => a.id)}::uuid[]) as t (id)
    `
    await tx`
      insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
      select id, created_at, monthly_price_cents, included_proxy_calls, overage_per_call_cents
      from plans where participant_id = any(${talking.map(a => a.id)}::uuid[])
    `
    await tx`
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select t.user_id, p.participant_id, p.id, 'active', ${askedAt}, ${askedAt}
      from unnest(${talking.map(a => a.id)}::uuid[], ${talking.map(a => a.userId!)}::uuid[]) as t (participant_id, user_id)
      join plans p on p.participant_id = t.participant_id
    `
  })
  return agents
}

export interface WaitingConversation {
  key: string
  agentId: string
  userId: string
}

/**
 * For each agent given, `users` users who wrote to it and wait for a reply: a pending conversation
 * each, with its one message and the agent's inbox entry left for the service to build. Returned in
 * a random order, so replies taking them in turn spread over the agents.
 */
export async function seedWaitingConversations(sql: Sql, agents: SeededAgent[], users: number): Promise<WaitingConversation[]> {
  const userIds = Array.from({ length: users }, () => randomUUID())
  const askedAt = new Date(Date.now() - 60_000)
  await sql.begin(async tx => {
    await skipForeignKeyChecks(tx)
    await tx`insert into users (id, provider_id) select id, 'bench-waiting-' || id from unnest(${userIds}::uuid[]) as t (id)`
    await tx`
      insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count)
      select a, u, 'Are you there?', ${askedAt}, 1
      from unnest(${agents.map(a => a.id)}::uuid[]) as a, unnest(${userIds}::uuid[]) as u
    `
    await tx`
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select gen_random_uuid(), a, u, 'user', 'Are you there?', ${askedAt}
      from unnest(${agents.map(a => a.id)}::uuid[]) as a, unnest(${userIds}::uuid[]) as u
    `
  })
  const waiting = agents.flatMap(agent => userIds.map(userId => ({ key: agent.key, agentId: agent.id, userId })))
  for (let i = waiting.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1))
    ;[waiting[i], waiting[j]] = [waiting[j]!, waiting[i]!]
  }
  return waiting
}
