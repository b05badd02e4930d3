/**
 * Agents' replies, written by the API process that receives them rather than by the agent's actor:
 * a reply touches one conversation, whose row lock in Postgres orders it against the user's messages
 * and other replies, and whose version orders the inbox's writes (inbox.ts). The replies of the
 * moment go to Postgres in one statement, one reply a conversation; then each conversation that
 * stopped being pending is written answered in its agent's inbox and the agent is answered. The
 * user is told by an event the statement records, and the outbox relay, delivering it, writes the
 * conversation in the inbox again as Postgres holds it (`inboxAfterReply`): that write is what
 * cannot be lost with the process, or refused by Redis, once the reply committed.
 */
import postgres from 'postgres'
import type { Sql } from '../db.ts'
import { errors } from '../errors.ts'
import { errorFields, type Log } from '../log.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PubSub } from '../pubsub.ts'
import type { Clock } from '../clock.ts'
import { createBatcher } from '../batcher.ts'
import type { RelayEffect } from '../events/relay.ts'
import { inactiveAgents } from '../participants/store.ts'
import { forgetInbox, writeConversation, type InboxDeps } from './inbox.ts'
import { conversationsNow, storeChosenReplies, storeFreshReplies, type ReplyStored } from './store.ts'

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

export interface ReplyWriterOptions {
  redis: Redis
  keys: Keys
  pubsub: PubSub
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
/** Postgres refused a value of one reply (bad text, say): nothing was stored, and that reply is at fault. */
const refusedValue = (error: unknown) => code(error).startsWith('22')

/**
 * The version at which the conversation was answered, if the inbox is to be told: every reply stored
 * now (one that found it answered already may have found it so by another process's reply, whose
 * write may not have landed yet: the agent's next poll must not see it pending), or a repeat finding
 * it answered (its first attempt's write may never have landed). A conversation pending again is its
 * user's message's to write. A write that changes nothing the poll shows is not announced (inbox.ts).
 */
function answeredAt(stored: ReplyStored): number | undefined {
  if (stored.stored) return stored.version
  return stored.conversation.pendingCount === 0 ? stored.conversation.version : undefined
}

export function createReplyWriter(options: ReplyWriterOptions): ReplyWriter {
  const { sql, log } = options
  let closed = false

  /** Before the answer, so the agent's next poll sees the conversation answered; if Redis refuses it, the relay writes it (`inboxAfterReply`). */
  const project = async (reply: AgentReply, stored: ReplyStored) => {
    const version = answeredAt(stored)
    if (version === undefined) return
    await writeConversation(options, reply.agentId, reply.userId, version, null).catch(error => {
      log.warn('reply projection failed; the outbox relay writes it', { agentId: reply.agentId, ...errorFields(error) })
    })
  }

  const answer = async (p: Pending, stored: ReplyStored | Error | undefined) => {
    if (stored instanceof Error) return p.reject(stored)
    if (!stored) return p.resolve(null)
    await project(p.reply, stored)
    const { messageId, userId, text } = p.reply
    p.resolve({ messageId, userId, text, createdAt: stored.createdAt.toISOString() })
  }

  /**
   * One statement for fresh ids and one for chosen ones (each is rolled back alone, so neither runs
   * again after the other committed), skipping conversations locked elsewhere; those skipped (and
   * those with no conversation to reply to) then go one a statement, one after another, each waiting
   * for its row. No statement waits on a row while holding another, so none can deadlock with a turn
   * that takes the same rows in another order. Resolves once stored, with the answers under way
   * (boxed, or awaiting it would wait for them).
   */
  const write = async (batch: Pending[], chosen: boolean, wait = false): Promise<{ answering: Promise<unknown> }> => {
    if (batch.length === 0) return { answering: Promise.resolve() }
    try {
      const rows = batch.map(({ reply }) => ({ id: reply.messageId, participantId: reply.agentId, userId: reply.userId, text: reply.text }))
      const at = options.clock.now()
      const outcomes = await (chosen ? storeChosenReplies(sql, rows, at, wait) : storeFreshReplies(sql, rows, at, wait))
      // In wait mode, one without an outcome has no conversation to reply to: answered null.
      const found = wait ? batch : batch.filter(p => outcomes.has(p.reply.messageId))
      const missed = wait ? [] : batch.filter(p => !outcomes.has(p.reply.messageId))
      const answering: Promise<unknown>[] = [Promise.all(found.map(p => answer(p, outcomes.get(p.reply.messageId))))]
      // One after another: each waits on a connection of the writer's few, which the next batch needs.
      for (const p of missed) answering.push((await write([p], chosen, true)).answering)
      return { answering: Promise.all(answering) }
    } catch (error) {
      if (refusedValue(error) && batch.length > 1) {
        // Nothing was stored: each alone, so only the reply at fault fails, with the client's error.
        const alone = await Promise.all(batch.map(p => write([p], chosen, wait)))
        return { answering: Promise.all(alone.map(a => a.answering)) }
      }
      // The statement may have committed (a connection lost): its events then have the relay write the inboxes.
      for (const p of batch) p.reject(failureOf(error))
      return { answering: Promise.resolve() }
    }
  }

  // One batch at a time carries the most replies for the least work (Postgres spent about a sixth less
  // a reply than with two side by side, which contend for the same index pages); another starts only
  // when the one under way has stalled, so a lock wait holds up the process's replies for no longer.
  const batcher = createBatcher<Pending>({
    slots: options.batches ?? 2,
    stalledMs: options.stalledMs ?? 20,
    maxKeys: options.batchSize ?? 256,
    perKey: 1,
    run: async (batch, free, done) => {
      // Each conversation goes on to its next reply once this one is answered (or failed).
      const unsettled = new Set(batch.keys())
      const settle = (key: string) => unsettled.delete(key) && (done(key), true)
      const pending = [...batch].map(([key, [p]]) => ({
        reply: p!.reply,
        resolve: (replied: Replied | null) => settle(key) && p!.resolve(replied),
        reject: (error: unknown) => settle(key) && p!.reject(error),
      }))
      try {
        const written = await Promise.all(
          [false, true].map(chosen =>
            write(
              pending.filter(p => p.reply.chosen === chosen),
              chosen,
            ),
          ),
        )
        free()
        await Promise.all(written.map(w => w.answering))
      } catch (error) {
        log.error('reply batch failed', { replies: pending.length, ...errorFields(error) })
      }
      // Every reply has been answered by now; should one not have been, it fails rather than hang.
      if (unsettled.size === 0) return
      const failure = errors.unavailable('The reply could not be stored; it may have been')
      for (const p of pending) p.reject(failure)
    },
  })

  return {
    send(reply) {
      if (closed) return Promise.reject(errors.unavailable('Shutting down'))
      return new Promise<Replied | null>((resolve, reject) => batcher.add(`${reply.agentId}:${reply.userId}`, { reply, resolve, reject }))
    },
    async close() {
      closed = true
      await batcher.drain()
    },
  }
}

/**
 * The relay's part of every reply (wired in src/deps.ts): for each `conversation.reply` event it
 * delivers, the conversation written in its agent's inbox as Postgres holds it now, by the inbox's
 * one rule (a write the reply's writer made already changes nothing, and announces nothing). The
 * event commits with the reply, so this is done even when the writer's process died between its
 * commit and its own write, or Redis refused that write. An agent deactivated since is left alone:
 * its inbox was forgotten, and written again it would stay in Redis for good, read by no one.
 *
 * One deactivated between the read and the writes may have had its inbox forgotten before they
 * landed: the agents found deactivated after the writes have it forgotten again (a deactivation
 * committed later forgets after them itself). Holding the agents' rows instead made a deactivation
 * wait for the whole pass, Redis calls included: 503 at its lock timeout while Redis hung.
 */
export function inboxAfterReply(deps: InboxDeps): RelayEffect {
  return async (tx, events) => {
    const pairs = new Map<string, { agentId: string; userId: string }>()
    for (const { userId, data } of events) {
      const { participantId } = JSON.parse(data) as { participantId: string }
      pairs.set(`${participantId}:${userId}`, { agentId: participantId, userId: userId! })
    }
    const conversations = await conversationsNow(tx, [...pairs.values()])
    await Promise.all(conversations.map(c => writeConversation(deps, c.agentId, c.userId, c.version, c.pending)))
    // Also those found deactivated before the writes: a forgetting Redis refused then is tried again with the events.
    const agents = [...new Set([...pairs.values()].map(p => p.agentId))]
    await Promise.all((await inactiveAgents(tx, agents)).map(agentId => forgetInbox(deps, agentId)))
  }
}

function failureOf(error: unknown) {
  if (refusedValue(error)) return errors.validation('The reply holds a value that cannot be stored')
  // Rolled back (a statement timeout, a lock wait given up, a deadlock) or cut off (the statement may
  // have committed): left as Postgres or the driver gave it, so that the error handler logs it as it
  // does any request's (a reply waiting out a lock, or one cut off, said nothing) and answers 503
  // with Retry-After, which a retry under the Idempotency-Key makes safe.
  return error
}
