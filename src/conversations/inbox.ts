/**
 * An agent's inbox in Redis: its pending conversations and open service requests, read by the poll
 * (inbox-reader.ts) from an in-process cache that pub/sub keeps honest. Service requests are written
 * by the agent's actor. Conversations are written by whoever changed them (the actor puts a user's
 * message, the API process removes what an agent's reply answered), so their projections are ordered
 * by the conversation's version in Postgres: one older than what the inbox holds is dropped.
 */
import { defineBatchedScript, defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PendingConversation } from './store.ts'

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

export interface InboxDeps {
  redis: Redis
  keys: Keys
}

/**
 * How long an answered conversation's version is kept after its entry went (a tombstone). Entries
 * are put only by the agent's actor, under its lease, after their commit, each conversation's in
 * version order; a put may still be on its way when a reply removes the conversation (its projection
 * failed and waits for a retry or a redelivery, up to 30 s apart), or while the actor is held. The
 * removal then leaves a tombstone, and the put, older, is dropped instead of bringing the
 * conversation back. Tombstones are few (a removal that finds the previous change's entry in place,
 * with the actor free, leaves none), so they are kept well past the longest retry delay.
 */
export const answeredKeepMs = 5 * 60_000

// KEYS the requests hash; ARGV channel, agent id, field, value (none: the field goes). Changed and
// announced in one step, so readers' caches never miss a change.
const change = defineScript(`
if ARGV[4] then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) else redis.call('HDEL', KEYS[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1`)

// Of both scripts below: the version an entry was written at (-1 for none), or nil for an entry
// written before versions (by a process of an older release), which nothing can be ordered against:
// the inbox is then marked for a rebuild from Postgres (K[4] its built marker).
const entryVersion = `
local function entryVersion(entry, K, A)
  if not entry then return -1 end
  local version = string.match(entry, '^{"version":(%d+),')
  if version then return tonumber(version) end
  redis.call('DEL', K[4])
  redis.call('PUBLISH', A[1], A[2])
  return nil
end`

// K inbox, answered (user -> version), answered-at (user -> ms), built; A channel, agent id, user id,
// version, entry. The actor's put of a pending conversation: applied only when newer than both the
// entry and the tombstone held for that user, and announced in the same step.
const put = defineBatchedScript(
  `${entryVersion}
local v = tonumber(A[4])
local gone = tonumber(redis.call('HGET', K[2], A[3]) or '-1')
if gone >= v then return 0 end
local held = entryVersion(redis.call('HGET', K[1], A[3]), K, A)
if not held or held >= v then return 0 end
redis.call('HSET', K[1], A[3], A[5])
if gone >= 0 then
  redis.call('HDEL', K[2], A[3])
  redis.call('ZREM', K[3], A[3])
end
redis.call('PUBLISH', A[1], A[2])
return 1`,
  4,
  5,
)

// K inbox, answered, answered-at, built, the actor's lease; A channel, agent id, user id, version. A
// conversation no longer pending: its entry goes if older, and that is announced. The change before
// a removal is the user's message it answers (version - 1); unless that message's entry is the one
// in place and the actor is free, a put may still be on its way, and a tombstone is left (see
// answeredKeepMs), each one written removing up to 16 past that age. An entry held means no
// tombstone is newer than it, so that is read only when there is none.
const remove = defineBatchedScript(
  `${entryVersion}
local v = tonumber(A[4])
local held = entryVersion(redis.call('HGET', K[1], A[3]), K, A)
if not held or held >= v then return 0 end
if held ~= v - 1 or redis.call('EXISTS', K[5]) == 1 then
  if held < 0 and tonumber(redis.call('HGET', K[2], A[3]) or '-1') >= v then return 0 end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HSET', K[2], A[3], v)
  redis.call('ZADD', K[3], now, A[3])
  local old = redis.call('ZRANGEBYSCORE', K[3], '-inf', now - ${answeredKeepMs}, 'LIMIT', 0, 16)
  if #old > 0 then
    redis.call('HDEL', K[2], unpack(old))
    redis.call('ZREM', K[3], unpack(old))
  end
  redis.call('PEXPIRE', K[2], ${answeredKeepMs})
  redis.call('PEXPIRE', K[3], ${answeredKeepMs})
end
if held < 0 then return 0 end
redis.call('HDEL', K[1], A[3])
redis.call('PUBLISH', A[1], A[2])
return 1`,
  5,
  4,
)

// KEYS inbox, answered, requests, built, lease; ARGV channel, agent id, holder, then (user id,
// version, entry) per pending conversation, '--', then (request id, entry) per open request. Replaces
// the inbox with what Postgres holds, but for conversations a reply took out meanwhile (a tombstone
// as new as the entry), and only while the lease it was read under is still held: a rebuild that
// lost it (a long pause) would overwrite what a newer holder wrote.
const replace = defineScript(`
if redis.call('GET', KEYS[5]) ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
local i = 4
while ARGV[i] ~= '--' do
  local gone = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '-1')
  if gone < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2]) end
  i = i + 3
end
for j = i + 1, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[j], ARGV[j + 1]) end
redis.call('SET', KEYS[4], '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1`)

/** The actor's put of a conversation pending at `version` (only under its lease); dropped if the inbox holds a newer one. */
export async function putConversation(deps: InboxDeps, agentId: string, version: number, pending: PendingConversation): Promise<void> {
  const k = deps.keys.agent(agentId)
  await put(deps.redis, [k.inbox, k.answered, k.answeredAt, k.built], [deps.keys.channels.inboxChanged, agentId, pending.userId, version, entry(version, pending)])
}

/** Takes a conversation no longer pending at `version` out of the agent's inbox (anyone may, lease or not). */
export async function removeConversation(deps: InboxDeps, agentId: string, userId: string, version: number): Promise<void> {
  const k = deps.keys.agent(agentId)
  const lease = deps.keys.actor(`agent:${agentId}`).lease
  await remove(deps.redis, [k.inbox, k.answered, k.answeredAt, k.built, lease], [deps.keys.channels.inboxChanged, agentId, userId, version])
}

/** Marks the inbox for a rebuild from Postgres at its next read, here and in every process. */
export async function invalidateInbox(deps: InboxDeps, agentId: string): Promise<void> {
  await deps.redis.multi().del(deps.keys.agent(agentId).built).publish(deps.keys.channels.inboxChanged, agentId).exec()
}

const repairs = new WeakMap<InboxDeps, (context: { id: string }) => Promise<void>>()

/**
 * The agent actor's `repair` for every handler that projects into its inbox: a projection given up
 * leaves the inbox stale, so it is rebuilt from Postgres. One function for given deps, so the repairs
 * its handlers ask for of one agent are one (repairs.ts keeps one per actor and function).
 */
export function inboxRepair(deps: InboxDeps): (context: { id: string }) => Promise<void> {
  let repair = repairs.get(deps)
  if (!repair) repairs.set(deps, (repair = ({ id }) => invalidateInbox(deps, id)))
  return repair
}

/** The stored form: the version first, where the scripts read it. */
function entry(version: number, conversation: PendingConversation): string {
  return JSON.stringify({ version, ...conversation })
}

export async function putOpenRequest(deps: InboxDeps, agentId: string, request: OpenServiceRequest) {
  const requests = deps.keys.agent(agentId).requests
  await change(deps.redis, [requests], [deps.keys.channels.inboxChanged, agentId, request.requestId, JSON.stringify(request)])
}

export async function removeOpenRequest(deps: InboxDeps, agentId: string, requestId: string) {
  await change(deps.redis, [deps.keys.agent(agentId).requests], [deps.keys.channels.inboxChanged, agentId, requestId])
}

/**
 * Replaces the whole inbox with what Postgres holds (conversations with their versions) and marks it
 * built, if `holder` still holds the agent's actor; says whether it did.
 */
export async function replaceInbox(
  deps: InboxDeps,
  agentId: string,
  holder: string,
  inbox: { conversations: (PendingConversation & { version: number })[]; requests: OpenServiceRequest[] },
): Promise<boolean> {
  const k = deps.keys.agent(agentId)
  const args: (string | number)[] = [deps.keys.channels.inboxChanged, agentId, holder]
  for (const { version, ...c } of inbox.conversations) args.push(c.userId, version, entry(version, c))
  args.push('--')
  for (const r of inbox.requests) args.push(r.requestId, JSON.stringify(r))
  return (await replace(deps.redis, [k.inbox, k.answered, k.requests, k.built, deps.keys.actor(`agent:${agentId}`).lease], args)) === 1
}
