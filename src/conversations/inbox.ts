/**
 * An agent's inbox in Redis: its pending conversations and open service requests, read by the poll
 * (inbox-reader.ts). It has one writer, the agent's actor: each change is written by the command that
 * made it (a user's message, a reply, a service request or its answer), and a rebuild from Postgres
 * is made under the actor's hold too. Every write is fenced inside Redis: it lands only while the
 * hold it was made under still stands (the lease is the holder's, and no hold was taken since), so a
 * holder that stalled past its lease never writes over a newer one.
 */
import { defineBatchedScript, defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { HoldLost, type Fence } from '../actors/types.ts'
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

// The fence, as Lua: K[1] lease, K[2] fence counter; the hold (holder, token) in A[1], A[2].
const held = `
local function held(K, A)
  return redis.call('GET', K[1]) == A[1] and redis.call('GET', K[2]) == A[2]
end`

// K lease, fence, hash; A holder, token, channel, agent id, field, value ('' removes the field).
// One entry of the inbox or its requests, written and announced if the hold stands.
const put = defineBatchedScript(
  `${held}
if not held(K, A) then return 0 end
if A[6] == '' then redis.call('HDEL', K[3], A[5]) else redis.call('HSET', K[3], A[5], A[6]) end
redis.call('PUBLISH', A[3], A[4])
return 1`,
  3,
  6,
)

// KEYS lease, fence, inbox, requests, built; ARGV holder, token, channel, agent id, then (user id,
// entry) per pending conversation, '--', then (request id, entry) per open request. Replaces both
// with what Postgres holds and marks the inbox built, if the hold stands.
const rebuild = defineScript(`${held}
if not held(KEYS, ARGV) then return 0 end
redis.call('DEL', KEYS[3], KEYS[4])
local i = 5
while ARGV[i] ~= '--' do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = i + 1, #ARGV, 2 do redis.call('HSET', KEYS[4], ARGV[j], ARGV[j + 1]) end
redis.call('SET', KEYS[5], '1')
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1`)

/** Throws `HoldLost` when the hold is gone: the change is then the inbox's repair's to bring in. */
const write = async (deps: InboxDeps, agentId: string, fence: Fence, hash: 'inbox' | 'requests', field: string, value: string) => {
  const actor = deps.keys.actor(`agent:${agentId}`)
  const keys = [actor.lease, actor.fence, deps.keys.agent(agentId)[hash]]
  const written = await put(deps.redis, keys, [fence.holder, fence.token, deps.keys.channels.inboxChanged, agentId, field, value])
  if (written !== 1) throw new HoldLost(`agent:${agentId}`)
}

/** Writes a conversation as it stands: pending, or answered (null, out of the inbox). */
export async function writeConversation(deps: InboxDeps, agentId: string, fence: Fence, userId: string, pending: PendingConversation | null) {
  await write(deps, agentId, fence, 'inbox', userId, pending ? JSON.stringify(pending) : '')
}

export async function putOpenRequest(deps: InboxDeps, agentId: string, fence: Fence, open: OpenServiceRequest) {
  await write(deps, agentId, fence, 'requests', open.requestId, JSON.stringify(open))
}

export async function removeOpenRequest(deps: InboxDeps, agentId: string, fence: Fence, requestId: string) {
  await write(deps, agentId, fence, 'requests', requestId, '')
}

/**
 * Frees the entries of requests that expired, without the hold: an expired request never comes back,
 * so nothing newer can be undone (the poll hides expired requests before this runs).
 */
export async function forgetExpiredRequest(deps: InboxDeps, agentId: string, requestId: string) {
  await deps.redis.hdel(deps.keys.agent(agentId).requests, requestId)
}

/** Marks the inbox for a rebuild from Postgres at its next read, here and in every process. */
export async function invalidateInbox(deps: InboxDeps, agentId: string): Promise<void> {
  await deps.redis.multi().del(deps.keys.agent(agentId).built).publish(deps.keys.channels.inboxChanged, agentId).exec()
}

/** Writes what Postgres holds and marks the inbox built, if the hold stands; says whether it did. */
export async function rebuildInbox(
  deps: InboxDeps,
  agentId: string,
  fence: Fence,
  stored: { conversations: PendingConversation[]; requests: OpenServiceRequest[] },
): Promise<boolean> {
  const k = deps.keys.agent(agentId)
  const actor = deps.keys.actor(`agent:${agentId}`)
  const args: (string | number)[] = [fence.holder, fence.token, deps.keys.channels.inboxChanged, agentId]
  for (const c of stored.conversations) args.push(c.userId, JSON.stringify(c))
  args.push('--')
  for (const r of stored.requests) args.push(r.requestId, JSON.stringify(r))
  return (await rebuild(deps.redis, [actor.lease, actor.fence, k.inbox, k.requests, k.built], args)) === 1
}

const repairs = new WeakMap<InboxDeps, (context: { id: string }) => Promise<void>>()

/**
 * The agent actor's `repair` for every handler that projects into its inbox: the inbox is rebuilt
 * from Postgres. One function for given deps, so the repairs of one agent asked for by its handlers
 * are one (repairs.ts keeps one per actor and function).
 */
export function inboxRepair(deps: InboxDeps): (context: { id: string }) => Promise<void> {
  let repair = repairs.get(deps)
  if (!repair) repairs.set(deps, (repair = ({ id }) => invalidateInbox(deps, id)))
  return repair
}
