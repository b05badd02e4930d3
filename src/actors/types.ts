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
  /** The hold it is applied under: projections write only while it lasts (see `Fence` in hold.ts). */
  fence: Fence
}

/** A hold as Redis knows it: the lease's holder and the fencing token drawn when it was taken. */
export interface Fence {
  holder: string
  token: number
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
   * projection of a command applied was given up (see repairs.ts). Idempotent; tried again until it lands.
   */
  repair?(context: RepairContext): Promise<void>
}

/** What a repair knows of the command it stands in for: the actor, not the hold (there is none). */
export type RepairContext = Pick<CommandContext, 'actor' | 'id' | 'commandId'>

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

/** A projection found its hold gone in Redis (taken over, or run out): what it would write is stale. */
export class HoldLost extends Error {
  constructor(actor: string) {
    super(`the hold on ${actor} was lost before its projection`)
  }
}
