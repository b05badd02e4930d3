/**
 * Sending commands to actors: each goes into its actor's mailbox, and the actor is marked due
 * (due.ts) for a runtime (runtime.ts), which applies it. `ask` waits for the command's answer,
 * published on this process's reply channel by whichever runtime applied it.
 */
import { randomUUID } from 'node:crypto'
import { closeRedis, type Redis } from '../redis.ts'
import type { PubSub } from '../pubsub.ts'
import type { Keys } from '../keys.ts'
import { errors } from '../errors.ts'
import { throttled, type Log } from '../log.ts'
import { createDue } from './due.ts'
import type { Answer } from './work.ts'

export interface SendOptions {
  /** Repeats with one id are applied once (derive it from an Idempotency-Key); random by default. */
  commandId?: string
  /** Fingerprint of the request behind the command, to refuse a reused id with another request. */
  requestHash?: Buffer
}

export interface Dispatcher {
  /** Sends a command; resolves once it is in the mailbox. */
  tell(actor: string, type: string, payload: unknown, options?: SendOptions): Promise<string>
  /** Sends a command and resolves with its result; 503 `unavailable` after the timeout (it stays in the mailbox, to be applied once unless Redis loses it). */
  ask<Result>(actor: string, type: string, payload: unknown, options?: SendOptions & { timeoutMs?: number }): Promise<Result>
  /** Waits for the sends under way, answers the asks still waiting 503, stops listening. */
  close(): Promise<void>
}

/** A command as its actor's mailbox holds it, and a runtime reads it (work.ts). */
export interface MailboxCommand {
  type: string
  /** The payload as JSON. */
  payload: string
  command: string
  /** Whether the command id may have been applied before (a chosen id, a command sent again). */
  repeatable: boolean
  /** The request's fingerprint in hex, or ''. */
  hash: string
  /** Where the answer goes, and the ask it answers ('' for none). */
  reply: string
  ask: string
}

/** The fields of a mailbox entry: every command goes in in this one form. */
export function mailboxEntry(command: MailboxCommand): string[] {
  return Object.entries({ ...command, repeatable: command.repeatable ? '1' : '' }).flat()
}

export interface DispatcherOptions {
  redis: Redis
  pubsub: PubSub
  keys: Keys
  /** Where asks that time out are told, once a minute (none: not logged). */
  log?: Log
}

export async function createDispatcher(options: DispatcherOptions): Promise<Dispatcher> {
  const { pubsub, keys } = options
  // Commands go out on a connection of their own with auto-pipelining: concurrent requests share writes.
  const redis = options.redis.duplicate({ enableAutoPipelining: true, connectionName: 'agent-marketplace:dispatch' })
  const replyChannel = keys.channels.actorReplies(randomUUID())
  const waiting = new Map<string, { resolve(result: unknown): void; reject(error: unknown): void; sendAgain(): Promise<unknown> }>()
  const due = createDue(redis, keys)
  const sending = new Set<Promise<unknown>>()
  // Every ask times out alike while no runtime applies commands (no workers process, or all stuck):
  // said once a minute, with how many were held back, so that the 503s have a cause in the log.
  const unanswered = options.log ? throttled(options.log, 60_000) : () => {}

  const stopListening = await pubsub.subscribe(replyChannel, message => {
    const { ask, ...reply } = JSON.parse(message) as { ask: string } & Answer
    const waiter = waiting.get(ask)
    if (!waiter) return
    if ('failed' in reply) waiter.reject(errors.unavailable('The command could not be applied'))
    else waiter.resolve(reply.result)
  })
  // An answer published while this process's subscriber was away from Redis is lost, and its ask
  // would wait out its timeout though the command was applied. Once listening again, each ask still
  // waiting is sent again under its command id, as one that may repeat: the runtime answers it once
  // more (with the first result, if it was applied) and applies it at most once.
  pubsub.onReconnect(() => {
    for (const waiter of waiting.values()) waiter.sendAgain().catch(() => {})
  })

  /**
   * Appends the command to its actor's mailbox and marks the actor due. Both go out on this one
   * connection, the append first, and Redis runs one connection's commands in order: the mark lands
   * after the entry, so a runtime that claims it finds the entry. Marked again only when either
   * failed (the command may have run though its reply was lost) or on a Cluster client, where the two
   * go to different nodes. Commands of one actor sent in turn reach its mailbox in turn.
   */
  const append = async (actor: string, fields: string[]) => {
    const [added, marked] = await Promise.allSettled([redis.xadd(keys.actor(actor).mailbox, '*', ...fields), due.mark(actor)])
    if (added.status === 'fulfilled' && marked.status === 'fulfilled' && !redis.isCluster) return
    const again = await due.mark(actor).then(
      () => true,
      () => false,
    )
    if (!again) markLater(actor)
    if (added.status === 'rejected' || !again) throw errors.unavailable('The command could not be sent; it may have been')
  }

  // Actors whose mail may be in their mailbox unmarked (the append may have landed, no mark did): marked
  // once Redis takes it, tried every half second meanwhile, so their mail never waits for the next command.
  // Each by how many sends left it so: a mark taken only counts for the sends before it was sent.
  const unmarked = new Map<string, number>()
  let closing = false
  let marking: Promise<void> | undefined
  const markOne = (actor: string, sends: number) =>
    due
      .mark(actor)
      .then(() => void (unmarked.get(actor) === sends && unmarked.delete(actor)))
      .catch(() => {})
  const markAll = () => Promise.all([...unmarked].map(([actor, sends]) => markOne(actor, sends)))
  const markLater = (actor: string) => {
    unmarked.set(actor, (unmarked.get(actor) ?? 0) + 1)
    // The loop ends in the same turn as it finds nothing left, so an actor added after that starts another.
    marking ??= (async () => {
      while (unmarked.size > 0 && !closing) await Bun.sleep(500).then(markAll)
      marking = undefined
    })()
  }

  const send = async (actor: string, type: string, payload: unknown, sendOptions: SendOptions, ask: string, command: string, again = false) => {
    const entry = mailboxEntry({
      type,
      payload: JSON.stringify(payload),
      command,
      // A chosen id may come again (a retried Idempotency-Key), and so may one sent again after its
      // answer was lost; a random one sent once never does.
      repeatable: Boolean(sendOptions.commandId) || again,
      hash: sendOptions.requestHash?.toString('hex') ?? '',
      reply: ask ? replyChannel : '',
      ask,
    })
    const sent = append(actor, entry)
    sending.add(sent)
    try {
      await sent
    } finally {
      sending.delete(sent)
    }
    return command
  }

  return {
    tell: (actor, type, payload, sendOptions = {}) => send(actor, type, payload, sendOptions, '', sendOptions.commandId ?? randomUUID()),
    async ask<Result>(actor: string, type: string, payload: unknown, sendOptions: SendOptions & { timeoutMs?: number } = {}) {
      const ask = randomUUID()
      const command = sendOptions.commandId ?? randomUUID()
      const timeoutMs = sendOptions.timeoutMs ?? 10_000
      const result = new Promise<Result>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(ask)
          unanswered('warn', 'unanswered', 'actor command not answered in time; it waits in its mailbox until a workers process applies it', {
            type,
            timeoutMs,
          })
          reject(errors.unavailable('The agent did not answer in time; the command may yet be applied: retry with the same Idempotency-Key'))
        }, timeoutMs)
        const done = () => (clearTimeout(timer), waiting.delete(ask))
        waiting.set(ask, {
          resolve: value => (done(), resolve(value as Result)),
          reject: error => (done(), reject(error)),
          sendAgain: () => send(actor, type, payload, sendOptions, ask, command, true),
        })
      })
      send(actor, type, payload, sendOptions, ask, command).catch(error => waiting.get(ask)?.reject(error))
      return result
    },
    async close() {
      await Promise.allSettled(sending)
      closing = true
      await marking
      await markAll()
      for (const waiter of waiting.values()) waiter.reject(errors.unavailable('Shutting down'))
      waiting.clear()
      await stopListening()
      await closeRedis(redis)
    },
  }
}
