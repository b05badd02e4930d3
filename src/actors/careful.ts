/**
 * Careful actors: one whose command failed a batch is worked alone, one command a turn, until that
 * command is applied, refused as bad input, or, failing `maxAttempts` times for a reason other than
 * an outage, moved to the actor's dead-letter stream (and answered as failed) so the actor goes on.
 */
import { isBadInput } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { errorFields, type Log } from '../log.ts'
import type { Hold } from './hold.ts'
import { isOutage, type Finished } from './work.ts'

// A command that fails this often for a reason other than an outage goes to the dead-letter stream.
const maxAttempts = 5

/**
 * The dead letters each actor's stream keeps, about (trimmed by Redis's whole nodes): the newest. A
 * bug that fails every command of a busy actor would otherwise pile its commands up in Redis for good
 * while no one sends them again; each one moved is logged (with its error) and counted all the same.
 */
export const deadLettersKept = 1000

export interface Careful {
  has(actor: string): boolean
  /** The actor's command failed a batch: from now on it is worked alone. */
  begin(actor: string): void
  /** Its command was applied: back to batches. */
  end(actor: string): void
  /** What a careful turn whose command failed answers: refused for bad input, failed on its last attempt, else nothing yet. */
  refuse(hold: Hold, cause: unknown, running: boolean): Promise<Finished[]>
}

/** `deadLettered` is told each command moved to a dead-letter stream, by its type (the metrics count them). */
export function createCareful(redis: Redis, keys: Keys, log: Log, deadLettered: (type: string) => void = () => {}): Careful {
  /** The failed attempts of each careful actor's command. */
  const attempts = new Map<string, number>()
  return {
    has: actor => attempts.has(actor),
    begin: actor => void attempts.set(actor, 0),
    end: actor => void attempts.delete(actor),
    async refuse(hold, cause, running) {
      const mail = hold.mail.find(m => m.list !== null)!
      if (!running || isOutage(cause)) return []
      if (isBadInput(cause)) {
        attempts.delete(hold.actor)
        return [{ mail, answer: { result: { refused: 'invalid_input' } } }]
      }
      const count = (attempts.get(hold.actor) ?? 0) + 1
      attempts.set(hold.actor, count)
      log.warn('actor command failed', { actor: hold.actor, type: mail.fields.type, attempt: count, ...errorFields(cause) })
      if (count < maxAttempts) return []
      const error = String((cause as Error)?.message)
      log.error('actor command moved to the dead-letter stream', { actor: hold.actor, type: mail.fields.type, entryId: mail.entryId, error })
      const dead = keys.actor(hold.actor).dead
      await redis.xadd(dead, 'MAXLEN', '~', deadLettersKept, '*', ...mail.list!, 'entry', mail.entryId, 'error', error)
      deadLettered(String(mail.fields.type))
      attempts.delete(hold.actor)
      return [{ mail, answer: { failed: true } }]
    },
  }
}
