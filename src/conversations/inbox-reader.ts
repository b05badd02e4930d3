/** Reading an agent's inbox for the poll: from process memory that pub/sub keeps honest, else Redis, else Postgres. */
import { randomUUID } from 'node:crypto'
import { watchServerIdentity, type Redis, type ServerIdentity } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PubSub } from '../pubsub.ts'
import type { DatabaseIdentity, Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import { createHolder, isHold, type Holder } from '../actors/hold.ts'
import { createDue, type Due } from '../actors/due.ts'
import { fenceOut } from '../actors/store.ts'
import { errors } from '../errors.ts'
import { openRequests } from './open-requests.ts'
import { isActiveAgent } from '../participants/store.ts'
import { agentConversations, type PendingConversation } from './store.ts'
import {
  beginRebuild,
  builtMark,
  finishRebuild,
  forgetInbox,
  rebuildConversations,
  rebuildPageSize,
  type AgentInbox,
  type OpenServiceRequest,
} from './inbox.ts'

export interface InboxReader {
  read(agentId: string): Promise<AgentInbox>
  /** The inbox if process memory holds it fresh, with no promise: the poll's usual answer. */
  peek(agentId: string): AgentInbox | undefined
  /** Forgets a deactivated agent's inbox in Redis, here and in every process (inbox.ts's `forgetInbox`). */
  forget(agentId: string): Promise<void>
  close(): Promise<void>
}

/**
 * Reads inboxes: from process memory when nothing changed since, else in one Redis round trip. An
 * inbox Redis lost is rebuilt from Postgres while holding the agent's actor, so
 * no service request changes meanwhile (conversations keep to their versions whoever writes them);
 * if someone else holds the actor, this poll is answered from Postgres. Rebuilds are bounded:
 * `rebuilds` at once, `waitingRebuilds` more waiting for a turn (polls of one agent share its
 * rebuild); beyond that a poll is 503 with Retry-After, as after Redis lost every inbox and every
 * agent polls at once, and while the line is full a poll of an inbox not held here is refused so
 * without reading Redis.
 */
export async function createInboxReader(options: {
  sql: Sql
  redis: Redis
  keys: Keys
  pubsub: PubSub
  clock: Clock
  /** The Postgres the pools reach: an inbox built from another is rebuilt, and this process's copies go when it changes. */
  database: Pick<DatabaseIdentity, 'current' | 'onChange'>
  ttlMs?: number
  maxEntries?: number
  rebuilds?: number
  waitingRebuilds?: number
  /** The lease of a rebuild's hold on the agent's actor (renewed while it runs). */
  holdMs?: number
}): Promise<InboxReader> {
  const { sql, redis, keys, pubsub, clock, database } = options
  const ttlMs = options.ttlMs ?? 300_000
  const maxEntries = options.maxEntries ?? 100_000
  // A holder of its own for each rebuild: two of one agent may overlap (the second begun after a
  // change), and a lease the first lost and the second took must not still pass for the first's.
  const holderId = `inbox:${randomUUID()}`
  let rebuilds = 0
  const server = watchServerIdentity(redis)
  const due = createDue(redis, keys)
  const cache = new Map<string, { inbox: AgentInbox; expires: number }>()
  const rebuilding = new Map<string, Promise<AgentInbox>>()
  // Under full load each of a rebuild's round trips waits a turn of a busy process, so rebuilds
  // keep up only side by side: 8 at once rebuilt 15 to 400 inboxes a second after Redis lost them
  // (bench/notes.md, 2026-11-28). Postgres runs no more of their statements at once than the
  // pool has connections.
  const turns = createTurns(options.rebuilds ?? 64, options.waitingRebuilds ?? 500)
  // Bumped by every change announcement: a read that overlaps one must not be cached.
  let epoch = 0

  // Listening starts with the first read: a process that never reads an inbox (a worker) gets no changes.
  // A rebuild under way may have read Postgres before the change: a poll after it starts its own.
  const changes = pubsub.listener(keys.channels.inboxChanged, agentId => {
    epoch++
    cache.delete(agentId)
    rebuilding.delete(agentId)
  })
  const forgetAll = () => {
    epoch++
    cache.clear()
    rebuilding.clear()
  }
  pubsub.onReconnect(forgetAll)
  database.onChange(forgetAll)

  /**
   * The inbox, or null when it is to be rebuilt: its "built" marker is gone (Redis lost it), or holds
   * another server's run id, or it was built from another Postgres. A Redis server restarted or failed
   * over may hold an older copy of the data (a snapshot, a replica that lagged) in which a message
   * acknowledged since is missing; a Postgres restored from a backup, or a replica of it promoted that
   * lagged, an older copy than the inbox was built from, with conversations, answers and versions the
   * inbox has and it never will. Only a Redis that refuses INFO, or a Postgres that does not say which
   * it is, keeps any marker.
   */
  const fetch = async (agentId: string) => {
    const k = keys.agent(agentId)
    const closes = server.closes()
    const [runId, results] = await Promise.all([server.runId(), redis.multi().get(k.built).hgetall(k.inbox).hgetall(k.requests).exec()])
    // Answered across a reconnect (ioredis sends what it queued while away on the new connection), perhaps by another server.
    if (server.closes() !== closes) return null
    const [built, inbox, requests] = (results ?? []).map(([error, value]) => {
      if (error) throw error
      return value
    }) as [string | null, Record<string, string>, Record<string, string>]
    if (built === null) return null
    const [builtOn, builtFrom] = built.split('/')
    if (runId !== null && builtOn !== runId) return null
    const from = database.current()
    if (from !== null && builtFrom !== from) return null
    return {
      conversations: Object.values(inbox)
        .map(value => JSON.parse(value) as PendingConversation)
        .sort(byTime),
      requests: Object.values(requests)
        .map(value => JSON.parse(value) as OpenServiceRequest)
        .sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.requestId.localeCompare(b.requestId)),
    }
  }

  const rebuild = async (agentId: string): Promise<AgentInbox> => {
    await turns.take()
    try {
      const holder = createHolder(redis, keys, `${holderId}:${++rebuilds}`, options.holdMs ?? 5000)
      return await rebuildHeld({ sql, redis, keys, clock, database, holder, due, server }, agentId)
    } finally {
      turns.give()
    }
  }

  const peek = (agentId: string) => {
    const hit = cache.get(agentId)
    return hit && hit.expires > performance.now() ? hit.inbox : undefined
  }

  return {
    peek,
    forget: agentId => forgetInbox({ redis, keys, pubsub }, agentId),
    async read(agentId) {
      const hit = peek(agentId)
      if (hit) return hit
      // The agent's rebuild under way answers this poll too. With the line full, any other poll is
      // refused before it reads Redis: after Redis lost every inbox, those reads (most finding the
      // inbox gone, to be refused all the same) kept a process under full load busy, and its
      // rebuilds' own calls waited behind them: 15 rebuilds a second (bench/notes.md, 2026-11-28).
      const underWay = rebuilding.get(agentId)
      if (underWay) return underWay
      turns.refuseWhenFull()
      await changes.listen()
      const started = epoch
      const inbox = await fetch(agentId)
      if (!inbox) {
        let pending = rebuilding.get(agentId)
        if (!pending) {
          const own: Promise<AgentInbox> = rebuild(agentId).finally(() => rebuilding.get(agentId) === own && rebuilding.delete(agentId))
          pending = own
          rebuilding.set(agentId, own)
        }
        return pending
      }
      if (epoch === started) {
        // A refreshed entry moves to the end; only a new one makes room, taking out the longest held.
        if (!cache.delete(agentId) && cache.size >= maxEntries) cache.delete(cache.keys().next().value!)
        cache.set(agentId, { inbox, expires: performance.now() + ttlMs })
      }
      return inbox
    },
    close: changes.stop,
  }
}

/**
 * Rebuilds an agent's inbox from Postgres holding its actor, so no service request changes meanwhile;
 * if someone else holds the actor, answers from Postgres and leaves Redis alone.
 */
async function rebuildHeld(deps: RebuildDeps, agentId: string): Promise<AgentInbox> {
  const { sql, redis, keys, clock, database, holder, due, server } = deps
  const actor = `agent:${agentId}`
  const [taken] = await holder.take([{ actor, mail: 0 }])
  const held = isHold(taken!)
  // Renewed while the rebuild runs: one of an agent with very many conversations takes seconds.
  const stopKeeping = isHold(taken!) ? holder.keep([taken]) : () => {}
  // Lets go; mail that came while the actor was held here is due at once for a runtime.
  const letGo = async () => {
    if ((await holder.release(actor, [])) > 0) await due.mark(actor)
  }
  // Failed (timed out, say), the take may still land: let go of whatever it took (a release follows it on the connection).
  if (taken instanceof Error) void letGo().catch(() => {})
  try {
    // Written only while still held: a rebuild whose hold ran out (a long pause) answers this poll
    // from what it read but leaves Redis to the newer holder. Page by page (the agent may have had
    // a million conversations), keeping only the pending ones. Emptied first, and marked with the
    // servers known as it began: should either change meanwhile, the next read rebuilds it again.
    const [runId, active] = await Promise.all([server.runId(), isActiveAgent(sql, agentId)])
    // Deactivated since its key was checked (by another process, whose eviction is on its way): its
    // inbox was forgotten, and built again it would stay in Redis for good, read by no one. One
    // deactivated after this check: its forgetting takes the lease, so none of the steps below writes.
    if (!active) throw errors.invalidToken()
    const from = builtMark(runId, database.current())
    // A turn whose holder lost its lease mid-way (paused) may still commit and project a service
    // request after this rebuild read them, which its last step would then overwrite: fenced out in
    // Postgres, it commits nothing more, and one committing now is waited for before anything is read.
    // Not fenced (a Postgres refusing writes, such a turn past the lock timeout, or a newer token in
    // Postgres than Redis drew: its counter lost, lifted past it for the next rebuild): the poll is
    // answered from Postgres and Redis left alone, as when the actor is held elsewhere.
    const fenced =
      held &&
      (await fenceOut(sql, actor, taken.token).then(
        fence =>
          fence === taken.token ||
          holder.raiseFence(actor, fence).then(
            () => false,
            () => false,
          ),
        () => false,
      ))
    let writing = fenced && (await beginRebuild({ redis, keys }, agentId, holder.id))
    const pending: PendingConversation[] = []
    const conversations = async () => {
      for (let afterUserId: string | null = null; ;) {
        const page = await agentConversations(sql, agentId, { afterUserId, limit: rebuildPageSize })
        for (const c of page) if (c.pending) pending.push(c.pending)
        if (writing) writing = await rebuildConversations({ redis, keys }, agentId, holder.id, page)
        if (page.length < rebuildPageSize) return
        afterUserId = page[page.length - 1]!.userId
      }
    }
    const [, requests] = await Promise.all([conversations(), openRequests(sql, agentId, clock.now())])
    if (writing) await finishRebuild({ redis, keys }, agentId, holder.id, from, requests)
    return { conversations: pending.sort(byTime), requests }
  } finally {
    stopKeeping()
    if (held) await letGo()
  }
}

interface RebuildDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  clock: Clock
  database: Pick<DatabaseIdentity, 'current'>
  holder: Holder
  due: Due
  server: ServerIdentity
}

/** At most `running` at once and `waiting` more in line; beyond, 503 with Retry-After. */
function createTurns(running: number, waiting: number) {
  let active = 0
  const line: (() => void)[] = []
  /** Throws what `take` would when no turn is free and the line is full, without waiting. */
  const refuseWhenFull = () => {
    if (active >= running && line.length >= waiting) throw errors.unavailable('Inboxes are being rebuilt; try again', 1)
  }
  return {
    refuseWhenFull,
    async take() {
      if (active < running) return void active++
      refuseWhenFull()
      // The turn is handed over by `give`, `active` unchanged.
      await new Promise<void>(resolve => line.push(resolve))
    },
    give() {
      const next = line.shift()
      if (next) next()
      else active--
    },
  }
}

const byTime = (a: PendingConversation, b: PendingConversation) =>
  a.latestMessageAt.localeCompare(b.latestMessageAt) || a.userId.localeCompare(b.userId)
