/**
 * An agent's inbox in Redis: its pending conversations and open service requests, written only by
 * its actor (projections) and read by the poll from an in-process cache that pub/sub keeps honest.
 */
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PubSub } from '../pubsub.ts'
import { randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import { acquireLease, releaseLease } from '../actors/lease.ts'
import { openRequests } from '../service-requests/store.ts'
import { pendingConversations, type PendingConversation } from './store.ts'

export interface OpenServiceRequest {
  requestId: string
  fromAgentId: string
  fromAgentName: string
  serviceTag: string | null
  input: string
  createdAt: string
  expiresAt: string
}

export interface AgentInbox {
  /** Oldest first. */
  conversations: PendingConversation[]
  /** Oldest first; may include expired ones until maintenance removes them (readers filter). */
  requests: OpenServiceRequest[]
}

interface InboxDeps {
  redis: Redis
  keys: Keys
}

// KEYS the hash; ARGV channel, agent id, field, value (none: the field goes). Changed and announced in
// one step, so readers' caches never miss a change.
const change = defineScript(`
if ARGV[4] then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) else redis.call('HDEL', KEYS[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1`)

export async function putPendingConversation(deps: InboxDeps, agentId: string, conversation: PendingConversation) {
  const inbox = deps.keys.agent(agentId).inbox
  await change(deps.redis, [inbox], [deps.keys.channels.inboxChanged, agentId, conversation.userId, JSON.stringify(conversation)])
}

export async function removePendingConversation(deps: InboxDeps, agentId: string, userId: string) {
  await change(deps.redis, [deps.keys.agent(agentId).inbox], [deps.keys.channels.inboxChanged, agentId, userId])
}

export async function putOpenRequest(deps: InboxDeps, agentId: string, request: OpenServiceRequest) {
  const requests = deps.keys.agent(agentId).requests
  await change(deps.redis, [requests], [deps.keys.channels.inboxChanged, agentId, request.requestId, JSON.stringify(request)])
}

export async function removeOpenRequest(deps: InboxDeps, agentId: string, requestId: string) {
  await change(deps.redis, [deps.keys.agent(agentId).requests], [deps.keys.channels.inboxChanged, agentId, requestId])
}

/** Replaces the whole inbox with what Postgres holds and marks it built. */
export async function replaceInbox(deps: InboxDeps, agentId: string, inbox: AgentInbox) {
  const keys = deps.keys.agent(agentId)
  const tx = deps.redis.multi().del(keys.inbox, keys.requests)
  for (const c of inbox.conversations) tx.hset(keys.inbox, c.userId, JSON.stringify(c))
  for (const r of inbox.requests) tx.hset(keys.requests, r.requestId, JSON.stringify(r))
  await tx.set(keys.built, '1').publish(deps.keys.channels.inboxChanged, agentId).exec()
}

export interface InboxReader {
  read(agentId: string): Promise<AgentInbox>
  /** The inbox if process memory holds it fresh, with no promise: the poll's usual answer. */
  peek(agentId: string): AgentInbox | undefined
  close(): Promise<void>
}

/**
 * Reads inboxes: from process memory when nothing changed since, else in one Redis round trip. An
 * inbox Redis lost (no "built" marker) is rebuilt from Postgres while holding the agent's actor, so
 * no command is applied meanwhile; if a runtime holds it, this poll is answered from Postgres.
 */
export async function createInboxReader(options: {
  sql: Sql
  redis: Redis
  keys: Keys
  pubsub: PubSub
  clock: Clock
  ttlMs?: number
  maxEntries?: number
}): Promise<InboxReader> {
  const { sql, redis, keys, pubsub, clock } = options
  const ttlMs = options.ttlMs ?? 30_000
  const maxEntries = options.maxEntries ?? 100_000
  const cache = new Map<string, { inbox: AgentInbox; expires: number }>()
  const rebuilding = new Map<string, Promise<AgentInbox>>()
  // Bumped by every change announcement: a read that overlaps one must not be cached.
  let epoch = 0

  // Listening starts with the first read: a process that never reads an inbox (a worker) gets no changes.
  const changes = pubsub.listener(keys.channels.inboxChanged, agentId => {
    epoch++
    cache.delete(agentId)
  })
  pubsub.onReconnect(() => {
    epoch++
    cache.clear()
  })

  const fetch = async (agentId: string) => {
    const k = keys.agent(agentId)
    const results = await redis.multi().exists(k.built).hgetall(k.inbox).hgetall(k.requests).exec()
    const [built, inbox, requests] = (results ?? []).map(([error, value]) => {
      if (error) throw error
      return value
    }) as [number, Record<string, string>, Record<string, string>]
    if (built !== 1) return null
    return {
      conversations: Object.values(inbox)
        .map(value => JSON.parse(value) as PendingConversation)
        .sort((a, b) => a.latestMessageAt.localeCompare(b.latestMessageAt) || a.userId.localeCompare(b.userId)),
      requests: Object.values(requests)
        .map(value => JSON.parse(value) as OpenServiceRequest)
        .sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.requestId.localeCompare(b.requestId)),
    }
  }

  const rebuild = async (agentId: string): Promise<AgentInbox> => {
    const actor = `agent:${agentId}`
    const holder = randomUUID()
    const token = await acquireLease({ redis, keys }, actor, holder, 5000)
    try {
      const inbox = { conversations: await pendingConversations(sql, agentId), requests: await openRequests(sql, agentId, clock.now()) }
      if (token !== null) await replaceInbox({ redis, keys }, agentId, inbox)
      return inbox
    } finally {
      if (token !== null) {
        await releaseLease({ redis, keys }, actor, holder)
        // Mail that came while the actor was held here: make sure a runtime looks at it.
        if ((await redis.xlen(keys.actor(actor).mailbox)) > 0) await redis.xadd(keys.actorsReady, '*', 'actor', actor)
      }
    }
  }

  const peek = (agentId: string) => {
    const hit = cache.get(agentId)
    return hit && hit.expires > Date.now() ? hit.inbox : undefined
  }

  return {
    peek,
    async read(agentId) {
      const hit = peek(agentId)
      if (hit) return hit
      await changes.listen()
      const started = epoch
      const inbox = await fetch(agentId)
      if (!inbox) {
        let pending = rebuilding.get(agentId)
        if (!pending) {
          pending = rebuild(agentId).finally(() => rebuilding.delete(agentId))
          rebuilding.set(agentId, pending)
        }
        return pending
      }
      if (epoch === started) {
        if (cache.size >= maxEntries) cache.delete(cache.keys().next().value!)
        cache.set(agentId, { inbox, expires: Date.now() + ttlMs })
      }
      return inbox
    },
    close: changes.stop,
  }
}
