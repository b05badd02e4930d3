/**
 * The runtime's turns on mail: takes a batch of actors, reads their mailboxes, applies the commands in
 * one turn, answers the senders who asked, and lets go with the finished entries acknowledged. An
 * actor whose command fails a batch is then worked alone, one command a turn: the same turn, whose
 * failure counts towards the dead-letter stream.
 */
import { isBadInput, isConnectionError } from '../db.ts'
import { isRedisUnavailable, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { errorFields } from '../log.ts'
import { applyTurn, BatchFailed, type BatchCommand, type TurnDeps } from './turn.ts'
import type { Hold, Holder, MailEntry } from './hold.ts'

/** What became of an actor in a batch. `more`: its mailbox still holds mail; work it again soon. */
export type Drain = 'drained' | 'more' | 'held' | 'interrupted' | 'failed'

export interface MailStats {
  /** Batch transactions committed, and the commands applied in them. */
  batches: number
  batchedCommands: number
  /** Commands applied one per turn (after a batch failed). */
  singleCommands: number
  /** Batches rolled back and worked again one command at a time. */
  rolledBack: number
}

export interface MailOptions extends TurnDeps {
  redis: Redis
  keys: Keys
  holder: Holder
  /** False once the runtime stops: no new command starts, and actors with mail are handed on. */
  running(): boolean
  /** True once stopped dead, like a killed process (for tests): nothing is answered or acknowledged. */
  abandoned(): boolean
  /** Test seam: runs after a command's effect and projection, before it is acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

// Commands of one actor read per batch.
const perActor = 32
// A command that fails this often for a reason other than an outage goes to the dead-letter stream.
const maxAttempts = 5

const transient = (error: unknown) => {
  const code = (error as { code?: string } | null)?.code
  return isConnectionError(error) || isRedisUnavailable(error) || code === '40001' || code === '40P01'
}

/** How an actor's turn ended: what becomes of it, and the entries finished, each with its answer. */
interface End {
  outcome: Drain | 'applied'
  finished: { mail: MailEntry; result: unknown }[]
}

export function createMailTurns(options: MailOptions) {
  const { redis, keys, holder, log } = options
  const stats: MailStats = { batches: 0, batchedCommands: 0, singleCommands: 0, rolledBack: 0 }
  /** Actors whose command failed a batch: worked alone, one command a turn, until it is finished. */
  const careful = new Set<string>()
  /** Failed attempts of each careful actor's command. */
  const attempts = new Map<string, number>()

  /**
   * Answers the finished entries' senders, before the acknowledgement: a crash between the two repeats
   * an answer rather than losing it. Entries whose answer could not be sent stay unacknowledged.
   */
  const answer = async (hold: Hold, finished: End['finished']) => {
    for (const { mail } of finished) if (mail.list) await options.beforeAck?.(hold.actor, commandIdOf(mail))
    if (options.abandoned()) return new Promise<never>(() => {})
    const sent = await Promise.allSettled(
      finished.map(({ mail, result }) =>
        mail.fields.reply
          ? redis.publish(mail.fields.reply, JSON.stringify({ ask: mail.fields.ask, ...(result === failure ? { failed: true } : { result }) }))
          : undefined,
      ),
    )
    return finished.filter((_, i) => sent[i]!.status === 'fulfilled').map(({ mail }) => mail.entryId)
  }

  /**
   * One turn for the actors taken. A turn that fails finishes nothing: in a batch, the actor whose
   * command failed first is worked alone, one command a turn, from then on; in such a careful turn,
   * the failure counts towards the dead-letter stream, or is refused at once for input that cannot
   * be stored.
   */
  const turn = async (holds: Hold[], alone: boolean): Promise<Map<Hold, End>> => {
    const commands = (h: Hold) => h.mail.filter(m => m.list !== null)
    const ends = new Map<Hold, End>(
      holds.map(h => [h, { outcome: 'applied', finished: h.mail.filter(m => m.list === null).map(mail => ({ mail, result: undefined })) }]),
    )
    const withMail = holds.filter(h => commands(h).length > 0)
    if (withMail.length === 0) return ends
    try {
      const { applied, fenced } = await applyTurn(
        options,
        withMail.map(h => ({ ...h, commands: commands(h).map(mail => commandOf(h, mail)) })),
        actor => !withMail.find(h => h.actor === actor)!.lost && options.running(),
      )
      stats[alone ? 'singleCommands' : 'batchedCommands'] += withMail.reduce((n, h) => n + commands(h).length, 0)
      if (!alone) stats.batches++
      for (const h of withMail) {
        const results = applied.get(h.actor)
        if (!results) {
          // A newer holder fenced this one out (Redis lost the counter): lift it, and let the next hold apply.
          await holder.raiseFence(h.actor, fenced.get(h.actor) ?? 0).catch(() => {})
          ends.set(h, { outcome: 'interrupted', finished: [] })
          continue
        }
        ends.get(h)!.finished.push(...commands(h).map((mail, i) => ({ mail, result: results[i]!.result })))
        careful.delete(h.actor)
        attempts.delete(h.actor)
      }
    } catch (error) {
      const cause = error instanceof BatchFailed ? error.cause : error
      const outcome = !options.running() ? 'interrupted' : transient(cause) ? 'failed' : 'more'
      for (const h of withMail) ends.set(h, { outcome, finished: [] })
      if (!alone) stats.rolledBack++
      if (outcome !== 'more') {
        if (outcome === 'failed') log.warn('actor turn failed; retrying', { actors: withMail.length, ...errorFields(cause) })
      } else if (alone) ends.set(withMail[0]!, await refuse(withMail[0]!, commands(withMail[0]!)[0]!, cause))
      else if (error instanceof BatchFailed) {
        careful.add(error.actor)
        log.debug('actor batch rolled back; the actor at fault goes one command at a time', { actor: error.actor, ...errorFields(cause) })
      }
    }
    return ends
  }

  /** A careful turn's command that failed: refused at once for bad input, else dead-lettered on its last attempt. */
  const refuse = async (hold: Hold, mail: MailEntry, cause: unknown): Promise<End> => {
    if (isBadInput(cause)) return { outcome: 'applied', finished: [{ mail, result: { refused: 'invalid_input' } }] }
    const count = (attempts.get(hold.actor) ?? 0) + 1
    attempts.set(hold.actor, count)
    log.warn('actor command failed', { actor: hold.actor, type: mail.fields.type, attempt: count, ...errorFields(cause) })
    if (count < maxAttempts) return { outcome: 'failed', finished: [] }
    attempts.delete(hold.actor)
    careful.delete(hold.actor)
    log.error('actor command moved to the dead-letter stream', { actor: hold.actor, type: mail.fields.type, entryId: mail.entryId })
    await redis.xadd(keys.actor(hold.actor).dead, '*', ...mail.list!, 'entry', mail.entryId, 'error', String((cause as Error)?.message))
    return { outcome: 'applied', finished: [{ mail, result: failure }] }
  }

  /** Answers, lets go with the answered entries acknowledged: what became of the actor. */
  const finish = async (hold: Hold, end: End): Promise<Drain> => {
    const acknowledged = await answer(hold, end.finished)
    const outcome = acknowledged.length < end.finished.length ? 'failed' : end.outcome
    const left = await holder.release(hold.actor, acknowledged).catch(error => {
      log.warn('actor acknowledgement failed', { actor: hold.actor, ...errorFields(error) })
      return 1
    })
    if (!options.running() && (outcome === 'more' || outcome === 'failed')) return 'interrupted'
    // Mail left after a round that read nothing came in after the read; its own hint brings the actor back.
    if (outcome === 'applied') return left === 0 || hold.mail.length === 0 ? 'drained' : 'more'
    return outcome
  }

  /** Takes the actors (careful ones one command each, alone), works them, lets go: what became of each. */
  const work = async (actors: string[]): Promise<Map<string, Drain>> => {
    const outcomes = new Map<string, Drain>()
    const take = async (group: string[], mail: number) =>
      (await holder.take(group, mail)).flatMap((taken, i) => {
        if (taken === 'busy') outcomes.set(group[i]!, 'held')
        else if (taken instanceof Error) {
          if (options.running()) log.warn('actor lease failed; retrying', { actor: group[i], ...errorFields(taken) })
          outcomes.set(group[i]!, 'failed')
        } else return [taken]
        return []
      })
    const [quick, slow] = await Promise.all([
      take(
        actors.filter(a => !careful.has(a)),
        perActor,
      ),
      take(
        actors.filter(a => careful.has(a)),
        1,
      ),
    ])
    const stopKeeping = holder.keep([...quick, ...slow])
    try {
      const ends = await Promise.all([turn(quick, false), ...slow.map(h => turn([h], true))])
      await Promise.all(ends.flatMap(turnEnds => [...turnEnds]).map(async ([hold, end]) => outcomes.set(hold.actor, await finish(hold, end))))
    } finally {
      stopKeeping()
    }
    return outcomes
  }

  return {
    work,
    stats: () => ({ ...stats }),
    /** Another runtime works the actor now: what this one remembered of its failures is of no use. */
    forget(actor: string) {
      careful.delete(actor)
      attempts.delete(actor)
    },
  }
}

/** Marks a dead-lettered command's answer: the sender is told it failed. */
const failure = Symbol('failed')

function commandIdOf(mail: MailEntry): string {
  return mail.fields.command || mail.entryId
}

function commandOf(hold: Hold, mail: MailEntry): BatchCommand {
  return {
    commandId: commandIdOf(mail),
    entryId: mail.entryId,
    type: mail.fields.type ?? '',
    payload: () => JSON.parse(mail.fields.payload ?? 'null'),
    requestHash: mail.fields.hash || null,
    mayRepeat: hold.redelivered || mail.fields.repeatable === '1',
    record: true,
  }
}
