/**
 * An agent's inbox in Redis: its pending conversations and open service requests, read by the poll
 * (inbox-reader.ts). Conversations have one write rule for every writer (the actor's put of a user's
 * message, a reply's answer, a rebuild): a change is applied only if the conversation's version (in
 * Postgres, raised by each message and reply under the row's lock) is newer than the one last
 * written, which the inbox keeps beside the entries. An answered conversation is written as answered
 * at its version, so a late put of an older version cannot bring it back. Service requests are
 * written only by the agent's actor, under its hold. A rebuild empties the inbox first: the versions
 * it records may be another Postgres's (a backup restored, a replica promoted that lagged), newer
 * than any this one holds, which the rule would keep for good.
 */
import { defineBatchedScript, defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PubSub } from '../pubsub.ts'
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
  /** Every change is announced to every process through Redis, and to this one's readers at once as well. */
  pubsub: Pick<PubSub, 'deliver'>
}

/** This process's readers forget the agent's inbox now: its next poll must not wait for the announcement from Redis. */
const announcedHere = (deps: InboxDeps, agentId: string) => deps.pubsub.deliver(deps.keys.channels.inboxChanged, agentId)

// The rule, as a Lua function: K inbox, versions; user id, version, entry ('' for answered). A
// conversation never written is older than any version, 0 included (rows from before versions).
// Returns 1 when the entries changed (what the poll shows); 0 when only the version moved on (an
// answer to a conversation already answered); -1 when the inbox had this version or a newer one.
const write = `
local function write(K, user, version, entry)
  if tonumber(redis.call('HGET', K[2], user) or '-1') >= tonumber(version) then return -1 end
  redis.call('HSET', K[2], user, version)
  if entry == '' then return redis.call('HDEL', K[1], user) end
  redis.call('HSET', K[1], user, entry)
  return 1
end`

// K inbox, versions; A channel, agent id, user id, version, entry. One conversation's change, announced if it changed an entry.
const change = defineBatchedScript(
  `${write}
local written = write(K, A[3], A[4], A[5])
if written ~= 1 then return written end
redis.call('PUBLISH', A[1], A[2])
return 1`,
  2,
  5,
)

// KEYS built, inbox, versions, requests, lease; ARGV holder. The first step of a rebuild: the inbox
// emptied, its marker first, while the hold lasts. Writes that land after it keep to the
// rule against the rebuild's (each committed before its write, so a write emptied away was read).
const rebuildBegin = defineScript(`
if redis.call('GET', KEYS[5]) ~= ARGV[1] then return 0 end
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1`)

// A rebuild writes an agent's conversations this many to a script call: every conversation the agent
// ever had goes into its inbox's versions, and one call for all of them held Redis for the whole
// write (560 ms at 50,000, 1.5 s at 200,000; at 1,000,000 the call's arguments did not fit the
// process's stack). Each call writes by the rule, so a rebuild in steps keeps every conversation
// at its newest version whoever writes between them; the inbox is marked built only by the last step.
export const rebuildPageSize = 1000

// KEYS inbox, versions, lease; ARGV holder, then (user id, version, entry) per conversation. Writes
// them by the rule while the hold they were read under lasts.
const rebuildPage = defineScript(`${write}
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 3 do write(KEYS, ARGV[i], ARGV[i + 1], ARGV[i + 2]) end
return 1`)

// KEYS requests, built, lease; ARGV channel, agent id, holder, mark, then (request id, entry) per
// open request. Replaces the requests and marks the inbox built (builtMark); only while the hold
// lasts, for the requests' sake (a rebuild paused past its lease would overwrite what a newer holder
// wrote).
const rebuildDone = defineScript(`
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
for j = 5, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1]) end
redis.call('SET', KEYS[2], ARGV[4])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1`)

// KEYS the requests hash; ARGV channel, agent id, field, value (none: the field goes).
const request = defineScript(`
if ARGV[4] then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) else redis.call('HDEL', KEYS[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1`)

/**
 * Writes a conversation as it stands at `version`: pending, or answered (null). Dropped if the inbox
 * has this version or a newer one. This process's readers are told of every write that changed what
 * the poll shows, and of every one that found another writer there first: the one that wrote it (the
 * outbox relay writing the same reply, say) announced it, but that announcement may reach them after
 * the caller's answer, and the agent's next poll, served from memory, would show what it replaced.
 */
export async function writeConversation(
  deps: InboxDeps,
  agentId: string,
  userId: string,
  version: number,
  pending: PendingConversation | null,
): Promise<void> {
  const k = deps.keys.agent(agentId)
  const changed = await change(
    deps.redis,
    [k.inbox, k.versions],
    [deps.keys.channels.inboxChanged, agentId, userId, version, pending ? JSON.stringify(pending) : ''],
  )
  if (changed === 1 || changed === -1) announcedHere(deps, agentId)
}

/** Marks the inbox for a rebuild from Postgres at its next read, here and in every process. */
export async function invalidateInbox(deps: InboxDeps, agentId: string): Promise<void> {
  await deps.redis.multi().del(deps.keys.agent(agentId).built).publish(deps.keys.channels.inboxChanged, agentId).exec()
  announcedHere(deps, agentId)
}

/**
 * Forgets a deactivated agent's inbox, here and in every process: no key of its polls again, and
 * nothing else reads it (its conversations and requests stay in Postgres). Its versions alone were
 * about 100 bytes a conversation the agent ever had, kept for good.
 *
 * The actor's lease goes with it: a rebuild that found the agent active just before the deactivation
 * writes only while it holds that lease (each step checks it), so it writes nothing more, where it
 * built the inbox again after this, to stay for good. A runtime holding the actor then finds its
 * hold lost, as after a pause: the fence counter stays, so the next holder's token fences it out in
 * Postgres, and that holder applies what it left.
 */
export async function forgetInbox(deps: InboxDeps, agentId: string): Promise<void> {
  const k = deps.keys.agent(agentId)
  const lease = deps.keys.actor(`agent:${agentId}`).lease
  await deps.redis.multi().unlink(k.built, k.inbox, k.versions, k.requests, lease).publish(deps.keys.channels.inboxChanged, agentId).exec()
  announcedHere(deps, agentId)
}

export async function putOpenRequest(deps: InboxDeps, agentId: string, open: OpenServiceRequest) {
  await request(deps.redis, [deps.keys.agent(agentId).requests], [deps.keys.channels.inboxChanged, agentId, open.requestId, JSON.stringify(open)])
  announcedHere(deps, agentId)
}

export async function removeOpenRequest(deps: InboxDeps, agentId: string, requestId: string) {
  await request(deps.redis, [deps.keys.agent(agentId).requests], [deps.keys.channels.inboxChanged, agentId, requestId])
  announcedHere(deps, agentId)
}

export interface StoredConversation {
  userId: string
  version: number
  pending: PendingConversation | null
}

/** The first step of a rebuild: empties the inbox if `holder` still holds the agent's actor; says whether it did. */
export async function beginRebuild(deps: Pick<InboxDeps, 'redis' | 'keys'>, agentId: string, holder: string): Promise<boolean> {
  const k = deps.keys.agent(agentId)
  const lease = deps.keys.actor(`agent:${agentId}`).lease
  return (await rebuildBegin(deps.redis, [k.built, k.inbox, k.versions, k.requests, lease], [holder])) === 1
}

/**
 * A step of a rebuild: writes a page of conversations (at most `rebuildPageSize`, as the inbox reader
 * reads them) as Postgres holds them, pending or not, at their versions, in one script call, if
 * `holder` still holds the agent's actor; says whether it did. The inbox is not built until
 * `finishRebuild`.
 */
export async function rebuildConversations(
  deps: Pick<InboxDeps, 'redis' | 'keys'>,
  agentId: string,
  holder: string,
  page: StoredConversation[],
): Promise<boolean> {
  const args: (string | number)[] = [holder]
  for (const c of page) args.push(c.userId, c.version, c.pending ? JSON.stringify(c.pending) : '')
  const k = deps.keys.agent(agentId)
  return (await rebuildPage(deps.redis, [k.inbox, k.versions, deps.keys.actor(`agent:${agentId}`).lease], args)) === 1
}

/**
 * What a built inbox is marked with, read by inbox-reader.ts: the run id of the Redis server it was
 * built on ('1' where Redis does not say) and the identity of the Postgres it was read from ('' where
 * Postgres does not say), as `runId/identity`.
 */
export const builtMark = (runId: string | null, database: string | null) => `${runId ?? '1'}/${database ?? ''}`

/** The last step of a rebuild: the open requests, and the inbox marked built (`mark`, builtMark's). */
export async function finishRebuild(
  deps: Pick<InboxDeps, 'redis' | 'keys'>,
  agentId: string,
  holder: string,
  mark: string,
  requests: OpenServiceRequest[],
): Promise<boolean> {
  const k = deps.keys.agent(agentId)
  const args: (string | number)[] = [deps.keys.channels.inboxChanged, agentId, holder, mark]
  for (const r of requests) args.push(r.requestId, JSON.stringify(r))
  const lease = deps.keys.actor(`agent:${agentId}`).lease
  return (await rebuildDone(deps.redis, [k.requests, k.built, lease], args)) === 1
}

/** The agent actor's `repair` for every handler that projects into its inbox: the inbox is rebuilt from Postgres. */
export function inboxRepair(deps: InboxDeps): (context: { id: string }) => Promise<void> {
  return ({ id }) => invalidateInbox(deps, id)
}
