/**
 * Agents' replies, written by the API process that receives them rather than by the agent's actor:
 * a reply touches one conversation, whose row lock in Postgres orders it against the user's messages
 * and other replies, and whose version orders the inbox projections. The replies of the moment go
 * to Postgres as one statement (`storeReplies`); then each conversation that stopped being pending
 * leaves its agent's inbox, the agent is answered, and the user is told.
 */
import postgres from 'postgres'
import type { Sql } from '../db.ts'
import { isConnectionError } from '../db.ts'
import { errors } from '../errors.ts'
import { errorFields } from '../log.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { projectConversation } from './inbox.ts'
import { storeReplies, type NewReply, type ReplyStored } from './store.ts'

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
  /** Takes no more replies and waits for those under way. */
  close(): Promise<void>
}

export interface ReplyWriterOptions extends NotifyDeps {
  /** Connections of its own, one per statement in flight. */
  sql: Sql
  /** Statements in flight at most: one, and another while the one under way is stalled. */
  batches?: number
  /** How long a statement runs before the writer counts it stalled (waiting on a lock, say) and starts another. */
  stalledMs?: number
  /** Conversations in one statement. */
  batchSize?: number
}

interface Pending {
  reply: AgentReply
  resolve(replied: Replied | null): void
  reject(error: unknown): void
}

// Deadlock detected, serialization failure: the statement was rolled back and may simply run again.
const retryable = new Set(['40P01', '40001'])
const maxAttempts = 3

/** The removal of a conversation from its agent's inbox, or a repeat's restatement of where it stands. */
export function replyProjection(stored: ReplyStored, userId: string) {
  if (stored.stored) return stored.version === null ? undefined : { version: stored.version, pending: null }
  const { version, pendingCount, latestMessage, latestMessageAt } = stored.conversation
  if (pendingCount === 0 || latestMessage === null || latestMessageAt === null) return { version, pending: null }
  return { version, pending: { userId, latestMessage, latestMessageAt: latestMessageAt.toISOString(), pendingCount } }
}

export function createReplyWriter(options: ReplyWriterOptions): ReplyWriter {
  const { sql, log } = options
  const batches = options.batches ?? 2
  const stalledMs = options.stalledMs ?? 20
  const batchSize = options.batchSize ?? 256
  /** Replies waiting for a statement, by conversation, in the order they came. */
  const queued = new Map<string, Pending[]>()
  /** Conversations in a statement under way: their next replies wait for it. */
  const working = new Set<string>()
  /** Statements under way, with when each began. */
  const running = new Map<Promise<void>, number>()
  /** Projections that failed, tried again in the background; and how to cut their waits short. */
  const retrying = new Set<Promise<void>>()
  const wakers = new Set<() => void>()
  let inFlight = 0
  let scheduled = false
  let recheck: ReturnType<typeof setTimeout> | undefined
  let closed = false

  const schedule = () => {
    if (scheduled || inFlight >= batches) return
    scheduled = true
    setImmediate(flush)
  }

  /**
   * One statement at a time carries the most replies for the least work (Postgres spent a fifth less
   * a reply than with two side by side, which contend for the same index pages); a second starts only
   * when the one under way has stalled, so a lock wait holds up the process's replies for no longer.
   */
  const mayStart = () => {
    if (inFlight === 0) return true
    if (inFlight >= batches) return false
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
    while (mayStart()) {
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
      inFlight++
      const run = write(batch.map(b => b.pending)).finally(() => {
        running.delete(run)
        for (const { conversation } of batch) working.delete(conversation)
        inFlight--
        if (queued.size > 0) schedule()
      })
      running.set(run, performance.now())
    }
  }

  /** One statement for the batch; then each reply is projected, answered and announced. */
  const write = async (batch: Pending[]) => {
    let outcomes: Map<string, ReplyStored>
    try {
      outcomes = await store(batch)
    } catch (error) {
      if (!(error instanceof postgres.PostgresError) || batch.length === 1) {
        // Lost on the way (the statement may have committed), or this reply's own failure.
        for (const p of batch) p.reject(isConnectionError(error) ? errors.unavailable('The reply could not be stored; it may have been') : error)
        return
      }
      // Postgres refused the statement, so nothing was stored: each reply alone, so only the one at fault fails.
      await Promise.all(batch.map(p => write([p])))
      return
    }
    await Promise.all(
      batch.map(async p => {
        const stored = outcomes.get(p.reply.messageId)
        if (!stored) return p.resolve(null)
        await project(p.reply, stored)
        const { messageId, userId, text } = p.reply
        p.resolve({ messageId, userId, text, createdAt: stored.createdAt.toISOString() })
        // The user hears of it after the agent has its answer; a repeat was announced the first time.
        if (stored.stored) void notify(options, userId, 'conversation.reply', { participantId: p.reply.agentId, messageId, text })
      }),
    )
  }

  const store = async (batch: Pending[]): Promise<Map<string, ReplyStored>> => {
    const rows: NewReply[] = batch.map(({ reply }) => ({ id: reply.messageId, participantId: reply.agentId, userId: reply.userId, text: reply.text, chosen: reply.chosen }))
    for (let attempt = 1; ; attempt++) {
      try {
        return await storeReplies(sql, rows, options.clock.now())
      } catch (error) {
        if (attempt === maxAttempts || !retryable.has((error as { code?: string }).code ?? '')) throw error
        log.debug('reply statement rolled back; running it again', { replies: rows.length, attempt, ...errorFields(error) })
      }
    }
  }

  /**
   * Before the answer, so the agent's next poll sees the conversation answered. A projection that
   * fails (Redis away) does not undo the stored reply: it is tried again in the background for a
   * while, which its version makes safe however late it lands.
   */
  const project = async (reply: AgentReply, stored: ReplyStored) => {
    const projection = replyProjection(stored, reply.userId)
    if (!projection) return
    const attempt = () => projectConversation(options, reply.agentId, reply.userId, projection.version, projection.pending)
    try {
      await attempt()
    } catch (error) {
      log.warn('reply projection failed; retrying in the background', { agentId: reply.agentId, ...errorFields(error) })
      const retry = retryProjection(attempt, reply.agentId).finally(() => retrying.delete(retry))
      retrying.add(retry)
    }
  }

  /** Waits `ms`, or less when the writer closes. */
  const pause = (ms: number) =>
    new Promise<void>(resolve => {
      const wake = () => {
        clearTimeout(timer)
        wakers.delete(wake)
        resolve()
      }
      const timer = setTimeout(wake, ms)
      wakers.add(wake)
    })

  const retryProjection = async (attempt: () => Promise<void>, agentId: string) => {
    for (let delay = 200; delay <= 25_600; delay *= 2) {
      await pause(delay)
      if (closed) break
      try {
        return await attempt()
      } catch {
        // Redis still away: wait longer.
      }
    }
    log.error('reply projection given up; the agent inbox is stale until its next change or rebuild', { agentId })
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
      while (running.size > 0 || queued.size > 0) {
        if (running.size === 0) schedule()
        await Promise.allSettled([...running.keys()])
        await Bun.sleep(0)
      }
      for (const wake of [...wakers]) wake()
      await Promise.allSettled([...retrying])
    },
  }
}
