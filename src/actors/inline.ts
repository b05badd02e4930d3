/**
 * Commands of idle actors applied by the process that sends them. An actor with no holder and no mail
 * is held right here and its command applied in a turn shared with the other idle actors' commands of
 * the moment: no mailbox entry, no runtime hop, no reply message. An actor that is held or has mail is
 * busy: the command goes to its mailbox, behind what is there, so each actor's commands still apply
 * one at a time, in order.
 */
import { randomUUID } from 'node:crypto'
import postgres from 'postgres'
import { isConnectionError } from '../db.ts'
import { errorFields } from '../log.ts'
import { errors } from '../errors.ts'
import { createBatcher } from '../batcher.ts'
import { createHolder, type Hold } from './hold.ts'
import { hintRuntimes } from './hints.ts'
import { applyTurn, BatchFailed } from './turn.ts'
import { createRepairs } from './repairs.ts'
import type { ActorRuntimeOptions } from './runtime.ts'

export interface InlineCommand {
  type: string
  payload: unknown
  commandId: string
  /** The sender chose the id (an Idempotency-Key): it may come again and is recorded as applied. */
  chosen: boolean
  requestHash: string | null
}

/** What became of a command: its result, or `mailed` (its actor was busy; it is in the mailbox now). */
export type InlineAnswer = { result: unknown } | 'mailed'

export interface InlineRunner {
  /** Whether commands of this type for this actor are applied here. */
  serves(actor: string, type: string): boolean
  /**
   * Applies the command if its actor is idle, else hands it to `toMailbox` (which sends it to the
   * actor's mailbox), always after the commands this process gave it before for that actor.
   */
  ask(actor: string, command: InlineCommand, toMailbox: () => Promise<unknown>): Promise<InlineAnswer>
  /** Takes no more commands (they go to the mailboxes) and waits for those under way. */
  close(): Promise<void>
}

/** The runtime's own settings, meaning the same here (`batches`: transactions in flight at once). */
export type InlineOptions = Pick<ActorRuntimeOptions, 'sql' | 'redis' | 'keys' | 'kinds' | 'clock' | 'log' | 'leaseMs' | 'batchActors' | 'batches'>

interface Pending {
  command: InlineCommand
  toMailbox(): Promise<unknown>
  resolve(answer: InlineAnswer): void
  reject(error: unknown): void
}

/** Sends an actor's commands to its mailbox, one after another: their order is the actor's. */
async function mail(pending: Pending[]) {
  for (const p of pending) await p.toMailbox().then(() => p.resolve('mailed'), p.reject)
}

/**
 * Certainly not committed: a command failed inside the transaction (which was then rolled back), or
 * Postgres itself refused it, COMMIT included. A lost connection may have come after the commit.
 */
function rolledBack(error: unknown): boolean {
  if (error instanceof postgres.PostgresError) return true
  return error instanceof BatchFailed && !isConnectionError(error.cause)
}

export function createInlineRunner(options: InlineOptions): InlineRunner {
  const { redis, keys, kinds, log } = options
  const leaseMs = options.leaseMs ?? 10_000
  const holder = createHolder(redis, keys, `inline:${randomUUID()}`, leaseMs)
  const repairs = createRepairs(log)
  const deps = { ...options, leaseMs, repairs }
  let closed = false

  /** Lets go; mail sent meanwhile (the actor was found held) is pointed out to the runtimes. */
  const letGo = (hold: Hold) =>
    holder
      .release(hold.actor, [])
      .then(left => (left > 0 ? hintRuntimes(redis, keys, hold.actor) : undefined))
      // Without the hint the runtimes' sweep still finds the mail; without the release the lease runs out.
      .catch(error => log.warn('inline actor release failed', { actor: hold.actor, ...errorFields(error) }))

  /** Holds the idle actors of the batch, applies their commands in one turn, answers, lets go. */
  const run = async (batch: Map<string, Pending[]>, free: () => void) => {
    if (closed) return void (await Promise.all([...batch.values()].map(mail)))
    const actors = [...batch.keys()]
    const taken = await holder.take(actors, 0)
    const holds: Hold[] = []
    // Held, with mail, or Redis failing: the mailbox path takes it (and reports an outage itself). A
    // failed call may still have taken the lease (its reply lost): let go of it first.
    const mailed = Promise.all(
      taken.map((t, i) => {
        if (t === 'busy') return mail(batch.get(actors[i]!)!)
        if (t instanceof Error)
          return holder
            .release(actors[i]!, [])
            .catch(() => 0)
            .then(() => mail(batch.get(actors[i]!)!))
        holds.push(t)
        return undefined
      }),
    )
    if (holds.length > 0) {
      const stopKeeping = holder.keep(holds)
      try {
        await turn(holds, batch, free)
      } finally {
        stopKeeping()
      }
    }
    await mailed
  }

  const turn = async (holds: Hold[], batch: Map<string, Pending[]>, free: () => void) => {
    const actors = holds.map(hold => ({
      ...hold,
      commands: batch.get(hold.actor)!.map(({ command }) => ({
        commandId: command.commandId,
        // Each sending of a chosen id is its own "entry": a repeat is answered, never projected again.
        entryId: command.chosen ? `inline:${randomUUID()}` : command.commandId,
        type: command.type,
        payload: () => command.payload,
        requestHash: command.requestHash,
        mayRepeat: command.chosen,
        record: command.chosen,
      })),
    }))
    const holdOf = new Map(holds.map(hold => [hold.actor, hold]))
    try {
      // Once the transaction is done the slot goes to the next batch, while these project.
      const { applied, fenced } = await applyTurn(deps, actors, actor => !holdOf.get(actor)!.lost && !closed, free)
      await Promise.all(
        holds.map(async hold => {
          const pending = batch.get(hold.actor)!
          const results = applied.get(hold.actor)
          if (results) pending.forEach((p, i) => p.resolve({ result: results[i]!.result }))
          // Redis lost the fence counter and handed out an old token: lift it, and let the mailbox path apply.
          else await holder.raiseFence(hold.actor, fenced.get(hold.actor) ?? 0).catch(() => {})
          await letGo(hold)
          if (!results) await mail(pending)
        }),
      )
    } catch (error) {
      await Promise.all(holds.map(letGo))
      const pending = holds.flatMap(hold => batch.get(hold.actor)!)
      if (rolledBack(error)) {
        // The runtime's careful path tells the failing command from the others.
        log.debug('inline actor batch rolled back; its commands go to the mailboxes', { actors: holds.length, ...errorFields(error) })
        return void (await Promise.all(holds.map(hold => mail(batch.get(hold.actor)!))))
      }
      // The commit may or may not have happened: answer as for any outage, never apply it again, and
      // repair what its projections would have changed.
      log.warn('inline actor batch failed', { actors: holds.length, ...errorFields(error) })
      for (const hold of holds) {
        for (const { command } of batch.get(hold.actor)!) {
          const context = { actor: hold.actor, id: hold.actor.slice(hold.kind.length + 1), commandId: command.commandId, at: options.clock.now() }
          repairs.add(kinds[hold.kind]?.[command.type], context)
        }
      }
      for (const p of pending) p.reject(errors.unavailable('The command could not be applied; it may have been'))
    }
  }

  const batcher = createBatcher<Pending>({ slots: options.batches ?? 2, maxKeys: options.batchActors ?? 256, run })

  return {
    serves: (actor, type) => kinds[actor.slice(0, actor.indexOf(':'))]?.[type] !== undefined,
    ask(actor, command, toMailbox) {
      return new Promise<InlineAnswer>((resolve, reject) => batcher.add(actor, { command, toMailbox, resolve, reject }))
    },
    async close() {
      closed = true
      await batcher.drain()
      await repairs.close()
    },
  }
}
