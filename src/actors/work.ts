/**
 * Working held actors: the mail read with the hold applied in one
 * turn (turn.ts), each command's sender answered, and each actor let go with the entries it finished
 * acknowledged. An entry not finished (the turn failed, the hold was lost, a projection given up that
 * no repair made good) stays in the mailbox for the next holder, who applies or projects it again.
 */
import { isDatabaseUnavailable, isTransientFailure } from '../db.ts'
import { isRedisUnavailable, type Redis } from '../redis.ts'
import { errorFields } from '../log.ts'
import { applyTurn, BatchFailed, due, type BatchCommand, type TurnDeps, type TurnOutcome } from './turn.ts'
import type { Hold, Holder, MailEntry } from './hold.ts'

/** What a sender learns of its command: the result, or that it could not be applied (dead-lettered). */
export type Answer = { result: unknown } | { failed: true }

/** An entry done with: answered (if its sender asked) and acknowledged, unless kept for the next holder to project. */
export interface Finished {
  mail: MailEntry
  answer: Answer
  kept?: boolean
}

export interface WorkDeps extends TurnDeps {
  redis: Redis
  holder: Holder
  /** False once closing: a projection that fails is left to the next holder rather than retried. */
  running(): boolean
  /** Test seam: once stopped dead, like a killed process, nothing is answered or acknowledged. */
  abandoned?(): boolean
  /** Test seam: runs after a command's effect and projection, before it is answered and acknowledged. */
  beforeAck?: (actor: string, commandId: string) => Promise<void> | void
}

export interface Worked {
  /** The turn failed and applied nothing: its error, and the actor whose command failed first. */
  failure?: { error: unknown; culprit?: string }
  /** Mail left in each actor's mailbox once let go; undefined where letting go failed. */
  left: Map<string, number | undefined>
}

/** When the turn of one hold worked alone fails: entries to finish all the same (refused, dead-lettered). */
export type Failed = (hold: Hold, error: unknown) => Promise<Finished[]>

/** Applies the holds' mail in one turn, answers, and lets go. */
export async function work(deps: WorkDeps, holds: Hold[], failed?: Failed): Promise<Worked> {
  const stopKeeping = deps.holder.keep(holds)
  try {
    // Entries deleted while pending were finished already: acknowledged with the rest.
    const ends = new Map<Hold, Finished[]>(
      holds.map(h => [h, h.mail.filter(m => m.list === null).map(mail => ({ mail, answer: { result: undefined } }))]),
    )
    const withMail = holds.filter(h => h.mail.some(m => m.list !== null))
    let failure: Worked['failure']
    if (withMail.length > 0) {
      try {
        const held = (actor: string) => !holds.find(h => h.actor === actor)!.lost && deps.running()
        const outcome = await applyTurn(deps, withMail.map(commandsOf), held)
        for (const h of withMail) ends.get(h)!.push(...(await settled(deps, h, outcome)))
      } catch (error) {
        failure = error instanceof BatchFailed ? { error: error.cause, culprit: error.actor } : { error }
      }
    }
    if (failure && failed && holds.length === 1) {
      const finished = await failed(holds[0]!, failure.error).catch(error => {
        deps.log.warn('actor failure handling failed; the command is tried again', { actor: holds[0]!.actor, ...errorFields(error) })
        return []
      })
      ends.get(holds[0]!)!.push(...finished)
    }
    const left = new Map<string, number | undefined>()
    await Promise.all(holds.map(async h => left.set(h.actor, await finish(deps, h, ends.get(h)!))))
    return { failure, left }
  } finally {
    stopKeeping()
  }
}

/**
 * The entries of one actor's turn, each answered: finished once projected, or once the handlers'
 * repair made good a projection given up while held; else kept, for the next holder to project again.
 * Fenced out (Redis lost the counter and handed out an old token): nothing, and the counter lifted.
 */
async function settled(deps: WorkDeps, hold: Hold, outcome: TurnOutcome): Promise<Finished[]> {
  const applied = outcome.applied.get(hold.actor)
  if (!applied) {
    await deps.holder.raiseFence(hold.actor, outcome.fenced.get(hold.actor) ?? 0).catch(() => {})
    return []
  }
  const mail = hold.mail.filter(m => m.list !== null)
  let done = outcome.projected.get(hold.actor)!
  const givenUp = applied.slice(done).filter(due)
  const repairs = new Set(givenUp.flatMap(a => (a.handler?.repair ? [a.handler.repair] : [])))
  if (givenUp.length > 0 && givenUp.every(a => a.handler?.repair) && !hold.lost && deps.running()) {
    try {
      for (const repair of repairs) await repair(applied[done]!.context)
      deps.log.error('actor projection given up; the actor’s Redis state was repaired instead', { actor: hold.actor })
      done = applied.length
    } catch (error) {
      deps.log.warn('actor repair failed; the next holder projects again', { actor: hold.actor, ...errorFields(error) })
    }
  }
  return mail.map((m, i) => ({ mail: m, answer: { result: applied[i]!.result }, kept: i >= done }))
}

/** Answers the finished entries' senders (a crash before the acknowledgement repeats an answer, never loses it), then lets go. */
async function finish(deps: WorkDeps, hold: Hold, finished: Finished[]): Promise<number | undefined> {
  for (const { mail } of finished) if (mail.list) await deps.beforeAck?.(hold.actor, mail.fields.command || mail.entryId)
  if (deps.abandoned?.()) return new Promise<never>(() => {})
  const sent = await Promise.allSettled(finished.map(({ mail, answer }) => send(deps, mail, answer)))
  const acknowledged = finished.filter((f, i) => sent[i]!.status === 'fulfilled' && !f.kept).map(({ mail }) => mail.entryId)
  return deps.holder.release(hold.actor, acknowledged).catch(error => {
    deps.log.warn('actor acknowledgement failed', { actor: hold.actor, ...errorFields(error) })
    return undefined
  })
}

async function send(deps: WorkDeps, mail: MailEntry, answer: Answer) {
  const { reply, ask } = mail.fields
  if (!reply || !ask) return
  await deps.redis.publish(reply, JSON.stringify({ ask, ...answer }))
}

function commandsOf(hold: Hold) {
  const commands: BatchCommand[] = hold.mail
    .filter(m => m.list !== null)
    .map(mail => ({
      commandId: mail.fields.command || mail.entryId,
      entryId: mail.entryId,
      type: mail.fields.type ?? '',
      payload: () => JSON.parse(mail.fields.payload ?? 'null'),
      requestHash: mail.fields.hash || null,
      mayRepeat: hold.redelivered || mail.fields.repeatable === '1',
    }))
  return { actor: hold.actor, kind: hold.kind, token: hold.token, commands }
}

/** A failure of Postgres or Redis (or a statement Postgres gave up or refused: a deadlock, a timeout, a full disk), not the command's doing: trying again later may apply it. */
export function isOutage(error: unknown): boolean {
  return isDatabaseUnavailable(error) || isRedisUnavailable(error) || isTransientFailure(error)
}
