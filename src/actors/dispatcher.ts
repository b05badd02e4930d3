/**
 * Sending commands to actors. Every command goes into its actor's mailbox. Where this process can
 * apply the actor's kind (`inline`) it appends and tries to take the actor in one step: taken (idle,
 * with nothing left unfinished), it works the mail right here, the commands of the moment of many
 * actors in one turn; held elsewhere, the holder finds the mail as it lets go. The actor is marked
 * due (due.ts) on the way, so a runtime takes over should no one finish it. `ask` waits for the
 * command's answer, from here or from whichever process applied it.
 */
import { randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Redis } from '../redis.ts'
import type { PubSub } from '../pubsub.ts'
import type { Keys } from '../keys.ts'
import { errorFields, type Log } from '../log.ts'
import { errors } from '../errors.ts'
import { createBatcher } from '../batcher.ts'
import type { ActorKinds } from './types.ts'
import { createHolder, type Hold } from './hold.ts'
import { createDue } from './due.ts'
import { isOutage, work, type Answer, type WorkDeps } from './work.ts'

export interface SendOptions {
  /** Repeats with one id are applied once (derive it from an Idempotency-Key); random by default. */
  commandId?: string
  /** Fingerprint of the request behind the command, to refuse a reused id with another request. */
  requestHash?: Buffer
}

export interface Dispatcher {
  /** Sends a command; resolves once it is in the mailbox, or applied when this process took its actor. */
  tell(actor: string, type: string, payload: unknown, options?: SendOptions): Promise<string>
  /** Sends a command and resolves with its result; 503 `unavailable` after the timeout (it stays in the mailbox, to be applied once unless Redis loses it). */
  ask<Result>(actor: string, type: string, payload: unknown, options?: SendOptions & { timeoutMs?: number }): Promise<Result>
  /** Applies nothing more here (what waits is mailed), waits for what is under way, stops listening. */
  close(): Promise<void>
}

export interface DispatcherOptions {
  redis: Redis
  pubsub: PubSub
  keys: Keys
  log: Log
  defaultTimeoutMs?: number
  /** Applies the commands of these kinds here when their actor is idle; without it a runtime applies every command. */
  inline?: { sql: Sql; clock: Clock; kinds: ActorKinds; leaseMs?: number; batches?: number; batchActors?: number }
}

interface Pending {
  fields: string[]
  /** The ask's id, '' for a tell. */
  ask: string
  /** Settles the send itself (a tell's promise): once mailed, or worked here. */
  sent(error?: unknown): void
}

// Commands of one actor read per turn: its backlog, if any, and what this process appends.
const perActor = 32

export async function createDispatcher(options: DispatcherOptions): Promise<Dispatcher> {
  const { pubsub, keys, log, inline } = options
  // Commands go out on a connection of their own with auto-pipelining: concurrent requests share writes.
  const redis = options.redis.duplicate({ enableAutoPipelining: true, connectionName: 'agent-marketplace:dispatch' })
  const processId = randomUUID()
  const replyChannel = keys.channels.actorReplies(processId)
  const waiting = new Map<string, { resolve(result: unknown): void; reject(error: unknown): void }>()
  const leaseMs = inline?.leaseMs ?? 10_000
  const holder = createHolder(redis, keys, `sender:${processId}`, leaseMs)
  const due = createDue(redis, keys)
  let closed = false
  let sends = 0

  const answer = (ask: string, reply: Answer) => {
    const waiter = waiting.get(ask)
    if (!waiter) return
    if ('failed' in reply) waiter.reject(errors.unavailable('The command could not be applied'))
    else waiter.resolve(reply.result)
  }
  const stopListening = await pubsub.subscribe(replyChannel, message => {
    const { ask, ...reply } = JSON.parse(message) as { ask: string } & Answer
    answer(ask, reply)
  })
  const deps: WorkDeps | undefined = inline && {
    ...inline,
    log,
    leaseMs,
    redis,
    holder,
    running: () => !closed,
    answerHere: (reply, ask, result) => reply === replyChannel && (answer(ask, result), true),
  }

  /**
   * Appends each actor's commands, marked due as they go (at once when left to a runtime, else for
   * after this process's hold would have run out, should it die holding the actor), and takes the
   * idle actors whose kinds it applies; works what it took, then marks the actors again.
   */
  const run = async (batch: Map<string, Pending[]>, free: () => void) => {
    const actors = [...batch.keys()]
    const here = actors.map(actor => deps !== undefined && !closed && deps.kinds[actor.slice(0, actor.indexOf(':'))] !== undefined)
    const owner = `${processId}:${++sends}`
    const marked = actors.map((actor, i) => due.mark(actor, here[i] ? 1.5 * leaseMs : 0, here[i] ? owner : '').catch(error => error as Error))
    const requests = actors.map((actor, i) => ({ actor, mail: here[i] ? perActor : -1, append: batch.get(actor)!.map(p => p.fields), fresh: true }))
    const taken = await holder.take(requests)
    const holds: Hold[] = []
    await Promise.all(
      taken.map(async (t, i) => {
        const [actor, pending] = [actors[i]!, batch.get(actors[i]!)!]
        const unmarked = await marked[i]
        if (unmarked) log.warn('actor due mark failed', { actor, ...errorFields(unmarked) })
        if (typeof t === 'object' && !(t instanceof Error)) return void holds.push(t)
        // Not taken, or failed (the mail may be in, and the lease taken with its reply lost: let go).
        if (t instanceof Error) await holder.release(actor, []).catch(() => 0)
        // Marked again now the append is known to have landed (the mark and the append may reach Redis
        // in either order): for after its holder's lease when held elsewhere (the holder's letting go is
        // what brings it on), else at once for a runtime (with unfinished mail: the careful path).
        const again = await due.mark(actor, t === 'busy' && here[i] ? 1.5 * leaseMs : 0).then(
          () => null,
          error => error as Error,
        )
        const failed = t instanceof Error ? t : again
        for (const p of pending) p.sent(failed ? errors.unavailable('The command could not be sent; it may have been') : undefined)
      }),
    )
    if (holds.length > 0) await workHere(holds, batch, owner, free)
  }

  const workHere = async (holds: Hold[], batch: Map<string, Pending[]>, owner: string, free: () => void) => {
    const { failure, left } = await work(deps!, holds, { committed: free })
    if (failure) log.debug('actor batch failed here; a runtime applies it', { actors: holds.length, ...errorFields(failure.error) })
    await Promise.all(
      holds.map(async ({ actor }) => {
        const rest = left.get(actor)
        // Drained: this send's mark goes. Mail left (a failed turn's too): due at once for a runtime.
        // Letting go failed: due once the lease would have run out.
        const marking = rest === undefined ? due.mark(actor, leaseMs) : rest === 0 && !failure ? due.settle(actor, owner) : due.mark(actor, 0)
        await marking.catch(error => log.warn('actor due mark failed', { actor, ...errorFields(error) }))
        for (const p of batch.get(actor)!) {
          // An outage: the caller hears of it now; the command stays in the mailbox, to be applied once
          // (unless Redis loses it: the caller's retry with the same id applies it once either way).
          if (failure && isOutage(failure.error) && p.ask)
            waiting
              .get(p.ask)
              ?.reject(errors.unavailable('The command could not be applied yet; it may be later: retry with the same Idempotency-Key'))
          p.sent()
        }
      }),
    )
  }

  const batcher = createBatcher<Pending>({ slots: inline?.batches ?? 2, maxKeys: inline?.batchActors ?? 256, run })

  const send = (actor: string, type: string, payload: unknown, sendOptions: SendOptions, ask: string) => {
    const command = sendOptions.commandId ?? randomUUID()
    const entry = {
      type,
      payload: JSON.stringify(payload),
      command,
      // A chosen id may come again (a retried Idempotency-Key); a random one never does.
      repeatable: sendOptions.commandId ? '1' : '',
      hash: sendOptions.requestHash?.toString('hex') ?? '',
      reply: ask ? replyChannel : '',
      ask,
    }
    return new Promise<string>((resolve, reject) =>
      batcher.add(actor, { fields: Object.entries(entry).flat(), ask, sent: error => (error ? reject(error) : resolve(command)) }),
    )
  }

  return {
    tell: (actor, type, payload, sendOptions = {}) => send(actor, type, payload, sendOptions, ''),
    async ask<Result>(actor: string, type: string, payload: unknown, sendOptions: SendOptions & { timeoutMs?: number } = {}) {
      const ask = randomUUID()
      const timeoutMs = sendOptions.timeoutMs ?? options.defaultTimeoutMs ?? 10_000
      const result = new Promise<Result>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(ask)
          reject(errors.unavailable('The agent did not answer in time; the command may yet be applied: retry with the same Idempotency-Key'))
        }, timeoutMs)
        const done = () => (clearTimeout(timer), waiting.delete(ask))
        waiting.set(ask, { resolve: value => (done(), resolve(value as Result)), reject: error => (done(), reject(error)) })
      })
      send(actor, type, payload, sendOptions, ask).catch(error => waiting.get(ask)?.reject(error))
      return result
    },
    async close() {
      closed = true
      await batcher.drain()
      for (const waiter of waiting.values()) waiter.reject(errors.unavailable('Shutting down'))
      waiting.clear()
      await stopListening()
      await redis.quit().catch(() => redis.disconnect())
    },
  }
}
