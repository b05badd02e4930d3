/**
 * Agents' replies, written by the API process that receives them rather than by the agent's actor:
 * a reply touches one conversation, whose row lock in Postgres orders it against the user's messages
 * and other replies, and whose version orders the inbox projections. The replies of the moment go
 * to Postgres together (`storeReplies`); then each conversation that stopped being pending leaves its
 * agent's inbox and the agent is answered; the user is told by an event the statement records.
 */
import postgres from 'postgres'
import type { Sql } from '../db.ts'
import { isConnectionError } from '../db.ts'
import { errors } from '../errors.ts'
import { errorFields, type Log } from '../log.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { createRetries } from '../retries.ts'
import { invalidateInbox, removeConversation } from './inbox.ts'
import { storeChosenReplies, storeFreshReplies, type NewReply, type ReplyStored } from './store.ts'

export interface AgentReply {
  agentId: string
  userId: string
  text: string
  /** The stored message's id: a repeat with the same id (an Idempotency-Key) is stored once. */
  messageId: string
  /** The sender chose the id, which an earlier attempt may have stored (else it is new). */
  chosen: boolean
}

export interface Replied {
  messageId: string
  userId: string
  text: string
  createdAt: string
}

export interface ReplyWriter {
  /** Stores the reply and answers with it; null when the user never wrote to the agent. */
  send(reply: AgentReply): Promise<Replied | null>
  /** Takes no more replies, waits for those under way, and tries once more what Redis did not take. */
  close(): Promise<void>
}

export interface ReplyWriterOptions {
  redis: Redis
  keys: Keys
  clock: Clock
  log: Log
  /** Connections of its own: two per batch in flight (fresh ids and chosen ones are statements apart). */
  sql: Sql
  /** Statements in flight at most: one, and another while the one under way is stalled. */
  batches?: number
  /** How long a batch runs before the writer counts it stalled (waiting on a lock, say) and starts another. */
  stalledMs?: number
  /** Conversations in one statement. */
  batchSize?: number
}

interface Pending {
  reply: AgentReply
  resolve(replied: Replied | null): void
  reject(error: unknown): void
}

const code = (error: unknown) => (error instanceof postgres.PostgresError ? error.code : '')
// Rolled back, and safe to run again: a deadlock's victim, a serialization failure.
const retryable = new Set(['40P01', '40001'])
const maxAttempts = 3
// Rolled back for want of time or a lock: the caller may try again.
const busy = new Set([...retryable, '55P03', '57014'])
/** Postgres refused a value of one reply (bad text, say): nothing was stored, and that reply is at fault. */
const refusedValue = (error: unknown) => code(error).startsWith('22')

/**
 * The version at which the conversation left its agent's inbox, if a removal is due: a reply that
 * ended its pending state, or a repeat finding it answered (its first attempt's removal may never
 * have landed). A conversation pending again is the actor's to put, under its lease.
 */
export function removalDue(stored: ReplyStored): number | undefined {
  if (stored.stored) return stored.wasPending ? stored.version : undefined
  return stored.conversation.pendingCount === 0 ? stored.conversation.version : undefined
}

/** An inbox change a reply could not make in Redis: a conversation's removal, or the whole inbox's rebuild. */
export type Unprojected = { agentId: string; userId: string; version: number } | { agentId: string; invalidate: true }

/** Of two changes waiting under one key, the one the inbox must come to: the newer removal of a conversation. */
export function newerChange(held: Unprojected, added: Unprojected): Unprojected {
  return 'version' in held && 'version' in added && held.version >= added.version ? held : added
}

export function createReplyWriter(options: ReplyWriterOptions): ReplyWriter {
  const { sql, log } = options
  const batches = options.batches ?? 2
  const stalledMs = options.stalledMs ?? 20
  const batchSize = options.batchSize ?? 256
  /** Replies waiting for a statement, by conversation, in the order they came. */
  const queued = new Map<string, Pending[]>()
  /** Conversations with a reply under way (stored or not, until it is answered): their next replies wait for it. */
  const working = new Set<string>()
  /** Batches whose statements are under way, with when each began. */
  const running = new Map<Promise<void>, number>()
  /** Batches stored, their replies being projected and answered. */
  const finishing = new Set<Promise<void>>()
  let scheduled = false
  let recheck: ReturnType<typeof setTimeout> | undefined
  let closed = false

  const schedule = () => {
    if (scheduled || running.size >= batches) return
    scheduled = true
    setImmediate(flush)
  }

  /**
   * One batch at a time carries the most replies for the least work (Postgres spent about a sixth less
   * a reply than with two side by side, which contend for the same index pages); another starts only
   * when the one under way has stalled, so a lock wait holds up the process's replies for no longer.
   */
  const mayStart = () => {
    if (running.size === 0) return true
    if (running.size >= batches) return false
    const since = performance.now() - Math.min(...running.values())
    if (since >= stalledMs) return true
    recheck ??= setTimeout(() => {
      recheck = undefined
      schedule()
    }, stalledMs - since)
    return false
  }

  const flush = () => {
    scheduled = false
    while (queued.size > 0 && mayStart()) {
      const batch: { conversation: string; pending: Pending }[] = []
      for (const [conversation, list] of queued) {
        if (working.has(conversation)) continue
        const pending = list.shift()!
        if (list.length === 0) queued.delete(conversation)
        working.add(conversation)
        batch.push({ conversation, pending })
        if (batch.length === batchSize) break
      }
      if (batch.length === 0) return
      // Each reply frees its conversation for the next one once it is answered (or failed), and only
      // then: a second answer or failure of the same reply changes nothing.
      const unsettled = new Set<Pending>()
      const pending = batch.map(({ conversation, pending: p }): Pending => {
        const settle = () => {
          if (!unsettled.delete(wrapped)) return false
          working.delete(conversation)
          if (queued.size > 0) schedule()
          return true
        }
        const wrapped: Pending = {
          reply: p.reply,
          resolve: replied => void (settle() && p.resolve(replied)),
          reject: error => void (settle() && p.reject(error)),
        }
        unsettled.add(wrapped)
        return wrapped
      })
      /** Fails every reply of the batch not yet answered. */
      const failRest = () => {
        if (unsettled.size === 0) return
        const error = errors.unavailable('The reply could not be stored; it may have been')
        for (const p of [...unsettled]) p.reject(error)
      }
      const failed = (error: unknown) => {
        // Not expected (each step handles its own failures); no caller may be left waiting.
        failRest()
        log.error('reply batch failed', { replies: pending.length, ...errorFields(error) })
      }
      // The statement holds the batch's slot; its projections and answers run beside the next one.
      const run = write(pending).then(
        ({ finished }) => {
          running.delete(run)
          const done: Promise<void> = finished
            .then(() => undefined, failed)
            .catch(() => undefined)
            .finally(() => {
              finishing.delete(done)
              // Every reply has been answered by now; should one not have been, it fails rather than
              // holding its conversation for good.
              failRest()
            })
          finishing.add(done)
          if (queued.size > 0) schedule()
        },
        error => {
          running.delete(run)
          try {
            failed(error)
          } catch {
            // Every reply was failed before the log was written.
          }
        },
      )
      running.set(run, performance.now())
    }
  }

  /**
   * The batch's statements, one for fresh ids and one for chosen ones (each is rolled back alone, so
   * neither runs again after the other committed). Resolves once they are done, with what is still
   * under way: each reply projected and answered (boxed, or awaiting it would wait for it).
   */
  const write = async (batch: Pending[]): Promise<{ finished: Promise<unknown> }> => {
    const fresh = batch.filter(p => !p.reply.chosen)
    const chosen = batch.filter(p => p.reply.chosen)
    const kinds = await Promise.all([fresh.length > 0 && writeKind(fresh, false), chosen.length > 0 && writeKind(chosen, true)])
    return { finished: Promise.all(kinds.map(kind => kind && kind.finished)) }
  }

  const settled = { finished: Promise.resolve() }

  const writeKind = async (batch: Pending[], chosen: boolean): Promise<{ finished: Promise<unknown> }> => {
    let outcomes: Map<string, ReplyStored | Error>
    try {
      outcomes = await store(batch, chosen)
    } catch (error) {
      if (refusedValue(error)) {
        // Nothing was stored: each alone, so only the reply at fault fails, with the client's error.
        if (batch.length > 1) {
          const alone = await Promise.all(batch.map(p => writeKind([p], chosen)))
          return { finished: Promise.all(alone.map(kind => kind.finished)) }
        }
        batch[0]!.reject(errors.validation('The reply holds a value that cannot be stored'))
        return settled
      }
      if (isConnectionError(error)) {
        // The statement may have committed, its removals unsent: the agents' inboxes are rebuilt.
        for (const p of batch) p.reject(errors.unavailable('The reply could not be stored; it may have been'))
        for (const agentId of new Set(batch.map(p => p.reply.agentId))) later({ agentId, invalidate: true })
        return settled
      }
      const failure = busy.has(code(error)) ? errors.unavailable('The database is busy; try again') : error
      for (const p of batch) p.reject(failure)
      return settled
    }
    return { finished: Promise.all(batch.map(p => answer(p, outcomes.get(p.reply.messageId)))) }
  }

  /** Projects a reply and answers it; never rejects (a failure fails that reply alone). */
  const answer = async (p: Pending, stored: ReplyStored | Error | undefined): Promise<void> => {
    try {
      if (stored instanceof Error) return p.reject(stored)
      if (!stored) return p.resolve(null)
      await project(p.reply, stored)
      const { messageId, userId, text } = p.reply
      p.resolve({ messageId, userId, text, createdAt: stored.createdAt.toISOString() })
    } catch (error) {
      log.error('reply not answered', { messageId: p.reply.messageId, ...errorFields(error) })
      p.reject(errors.unavailable('The reply could not be stored; it may have been'))
    }
  }

  const store = async (batch: Pending[], chosen: boolean): Promise<Map<string, ReplyStored | Error>> => {
    // In key order: statements that lock the same rows take them in one order where the plan allows.
    const rows: NewReply[] = batch
      .map(({ reply }) => ({ id: reply.messageId, participantId: reply.agentId, userId: reply.userId, text: reply.text }))
      .sort((a, b) => (a.participantId < b.participantId ? -1 : a.participantId > b.participantId ? 1 : a.userId < b.userId ? -1 : 1))
    for (let attempt = 1; ; attempt++) {
      try {
        const at = options.clock.now()
        return await (chosen ? storeChosenReplies(sql, rows, at) : storeFreshReplies(sql, rows, at))
      } catch (error) {
        if (attempt === maxAttempts || !retryable.has(code(error))) throw error
        log.debug('reply statement rolled back; running it again', { replies: rows.length, attempt, ...errorFields(error) })
      }
    }
  }

  /**
   * Inbox changes Redis did not take, tried again in the background until they land: the newest
   * removal of each conversation, and inboxes to rebuild (a statement whose outcome is unknown).
   */
  const unprojected = createRetries<Unprojected>({
    attempt: change =>
      'invalidate' in change ? invalidateInbox(options, change.agentId) : removeConversation(options, change.agentId, change.userId, change.version),
    merge: newerChange,
    initialDelayMs: 200,
  })

  const later = (change: Unprojected) => {
    const key = 'invalidate' in change ? change.agentId : `${change.agentId}:${change.userId}`
    if (!unprojected.add(key, change)) {
      log.error('reply projection given up after shutdown; that agent’s inbox is stale until its next change or rebuild', { agentId: change.agentId })
    }
  }

  /**
   * Before the answer, so the agent's next poll sees the conversation answered. A removal that fails
   * (Redis away) does not undo the stored reply: it is tried again in the background until it lands,
   * which its version makes safe however late that is.
   */
  const project = async (reply: AgentReply, stored: ReplyStored) => {
    const version = removalDue(stored)
    if (version === undefined) return
    try {
      await removeConversation(options, reply.agentId, reply.userId, version)
    } catch (error) {
      log.warn('reply projection failed; retrying in the background', { agentId: reply.agentId, ...errorFields(error) })
      later({ agentId: reply.agentId, userId: reply.userId, version })
    }
  }

  return {
    send(reply) {
      if (closed) return Promise.reject(errors.unavailable('Shutting down'))
      return new Promise<Replied | null>((resolve, reject) => {
        const conversation = `${reply.agentId}:${reply.userId}`
        const pending = { reply, resolve, reject }
        const list = queued.get(conversation)
        if (list) list.push(pending)
        else queued.set(conversation, [pending])
        schedule()
      })
    },
    async close() {
      closed = true
      while (running.size > 0 || queued.size > 0 || finishing.size > 0) {
        if (running.size === 0) schedule()
        await Promise.allSettled([...running.keys(), ...finishing])
        await Bun.sleep(0)
      }
      clearTimeout(recheck)
      const left = await unprojected.close()
      if (left.size > 0) {
        log.error('reply projections given up at shutdown; those agents’ inboxes are stale until their next change or rebuild', {
          conversations: left.size,
        })
      }
    },
  }
}
