/** Sending commands to actors: append to the actor's mailbox stream and hint the runtimes; `ask` waits for the result. */
import { randomUUID } from 'node:crypto'
import type { Redis } from '../redis.ts'
import type { PubSub } from '../pubsub.ts'
import type { Keys } from '../keys.ts'
import { errors } from '../errors.ts'
import type { InlineRunner } from './inline.ts'
import { hintRuntimes } from './hints.ts'

export interface SendOptions {
  /** Repeats with one id are applied once (derive it from an Idempotency-Key); random by default. */
  commandId?: string
  /** Fingerprint of the request behind the command, to refuse a reused id with another request. */
  requestHash?: Buffer
}

export interface Dispatcher {
  /** Sends a command; resolves once it is in the mailbox, or applied when this process applied it (an idle actor). */
  tell(actor: string, type: string, payload: unknown, options?: SendOptions): Promise<string>
  /** Queues a command and resolves with its result; 503 `unavailable` after the timeout (it is still applied once). */
  ask<Result>(actor: string, type: string, payload: unknown, options?: SendOptions & { timeoutMs?: number }): Promise<Result>
  close(): Promise<void>
}

export async function createDispatcher(options: {
  redis: Redis
  pubsub: PubSub
  keys: Keys
  defaultTimeoutMs?: number
  /** Applies the commands of idle actors here and now; without it every command goes to a mailbox. */
  inline?: InlineRunner
}): Promise<Dispatcher> {
  const { redis, pubsub, keys } = options
  // Commands go out on a connection of their own with auto-pipelining: concurrent requests share writes.
  const sending = redis.duplicate({ enableAutoPipelining: true, connectionName: 'agent-marketplace:dispatch' })
  const replyChannel = keys.channels.actorReplies(randomUUID())
  const waiting = new Map<string, { resolve(result: unknown): void; reject(error: unknown): void }>()

  const stop = await pubsub.subscribe(replyChannel, message => {
    const reply = JSON.parse(message) as { ask: string; result?: unknown; failed?: boolean }
    const waiter = waiting.get(reply.ask)
    if (!waiter) return
    if (reply.failed) waiter.reject(errors.unavailable('The command could not be applied'))
    else waiter.resolve(reply.result)
  })

  const send = async (actor: string, type: string, payload: unknown, sendOptions: SendOptions, ask: string) => {
    const commandId = sendOptions.commandId ?? randomUUID()
    const fields = [
      'type',
      type,
      'payload',
      JSON.stringify(payload),
      'command',
      commandId,
      // A chosen id may come again (a retried Idempotency-Key); a random one never does.
      'repeatable',
      sendOptions.commandId ? '1' : '',
      'hash',
      sendOptions.requestHash?.toString('hex') ?? '',
      'reply',
      ask ? replyChannel : '',
      'ask',
      ask,
    ]
    // Two commands, not one transaction: the keys live in different Redis Cluster slots. The hint is sent
    // once the mail is in (on a Cluster they would go to different nodes, in no set order); should the
    // hint be lost, the runtimes' sweep still finds the mail. On the auto-pipelined connection each
    // leaves in a write shared with whatever other requests sent in the same tick.
    await sending.xadd(keys.actor(actor).mailbox, '*', ...fields)
    await hintRuntimes(sending, keys, actor)
    return commandId
  }

  /** Applied here if the actor is idle, else mailed; either way after what this process gave the actor before. */
  const viaInline = (actor: string, type: string, payload: unknown, sendOptions: SendOptions, ask: string) => {
    const commandId = sendOptions.commandId ?? randomUUID()
    const command = {
      type,
      payload,
      commandId,
      chosen: sendOptions.commandId !== undefined,
      requestHash: sendOptions.requestHash?.toString('hex') ?? null,
    }
    return options.inline!.ask(actor, command, () => send(actor, type, payload, { ...sendOptions, commandId }, ask))
  }
  const inlined = (actor: string, type: string) => options.inline?.serves(actor, type) ?? false

  return {
    async tell(actor, type, payload, sendOptions = {}) {
      if (!inlined(actor, type)) return send(actor, type, payload, sendOptions, '')
      const commandId = sendOptions.commandId ?? randomUUID()
      await viaInline(actor, type, payload, { ...sendOptions, commandId }, '')
      return commandId
    },
    async ask<Result>(actor: string, type: string, payload: unknown, sendOptions: SendOptions & { timeoutMs?: number } = {}) {
      const ask = randomUUID()
      const timeoutMs = sendOptions.timeoutMs ?? options.defaultTimeoutMs ?? 10_000
      const result = new Promise<Result>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(ask)
          reject(errors.unavailable('The agent did not answer in time; the command will still be applied once'))
        }, timeoutMs)
        waiting.set(ask, {
          resolve: value => {
            clearTimeout(timer)
            waiting.delete(ask)
            resolve(value as Result)
          },
          reject: error => {
            clearTimeout(timer)
            waiting.delete(ask)
            reject(error)
          },
        })
      })
      // Sent before returning when not inlined: an ask followed by a tell reaches the mailbox in that order.
      const sent = inlined(actor, type) ? viaInline(actor, type, payload, sendOptions, ask) : send(actor, type, payload, sendOptions, ask)
      sent.then(
        answer => {
          if (typeof answer === 'object') waiting.get(ask)?.resolve(answer.result)
        },
        error => waiting.get(ask)?.reject(error),
      )
      return result
    },
    async close() {
      await options.inline?.close()
      for (const waiter of waiting.values()) waiter.reject(errors.unavailable('Shutting down'))
      waiting.clear()
      await stop()
      await sending.quit().catch(() => sending.disconnect())
    },
  }
}
