/** What an actor kind is: named commands, each an effect in Postgres and an optional Redis projection. */
import type { TxSql } from '../db.ts'

export interface CommandContext {
  /** `kind:id` of the actor applying the command. */
  actor: string
  /** The actor's id without its kind. */
  id: string
  commandId: string
  /** When the command is applied: the actor's clock, not the sender's. */
  at: Date
  /**
   * Says the effect took a time later than `at` (a conversation's own order pushed it on): the
   * actor's later commands are given later times still, so what it shows stays in the order it came.
   */
  passed?(time: Date): void
}

export interface CommandHandler<Payload = any, Result = any> {
  /**
   * The effect, inside the transaction that also records the command as applied. Domain refusals are
   * results, not throws. The transaction is shared with other actors' commands of the same batch,
   * whose statements interleave with this one's: touch only this actor's rows (or read others'), and
   * open no savepoints, whose rollback would undo the other actors' statements too.
   */
  apply(tx: TxSql, payload: Payload, context: CommandContext): Promise<Result>
  /** Runs after the commit and again on every redelivery, so it must be idempotent (Redis state the actor owns). */
  project?(result: Result, payload: Payload, context: CommandContext): Promise<void>
  /**
   * Optional, with `project`: marks the actor's Redis state for a rebuild from Postgres, for when a
   * projection kept failing while held (work.ts). Idempotent; if it fails too, the next holder projects again.
   */
  repair?(context: CommandContext): Promise<void>
}

/** Command handlers of one kind of actor, by command type. */
export type ActorKind = Record<string, CommandHandler>

/** Every kind the runtime serves, by kind name ('agent', 'org'). */
export type ActorKinds = Record<string, ActorKind>

/** What a refused command answers; any other result is a success. */
export interface Refusal {
  refused: string
}

export function isRefusal(result: unknown): result is Refusal {
  return typeof result === 'object' && result !== null && typeof (result as Refusal).refused === 'string'
}
