/**
 * Events, written to the outbox in the transaction of the change that causes them; the relay
 * (relay.ts) delivers them to the recipients' streams once committed, whatever Redis was doing.
 */
import type { Db } from '../db.ts'

export type EventType =
  | 'subscription.created'
  | 'subscription.cancelled'
  | 'review.created'
  | 'review.updated'
  | 'config.purchased'
  | 'conversation.message'
  | 'conversation.reply'
  | 'service.requested'
  | 'service.completed'
  | 'service.failed'
  | 'invoice.issued'
  // recorded set-based by src/billing/plans/price-change.ts
  | 'plan.changed'
  | 'usage.threshold'
  | 'blog.published'
  | 'context.updated'
  | 'chat.message'

export interface NewEvent {
  /** The recipient; null for world chat. */
  userId: string | null
  type: EventType
  payload: EventPayload
}

/** An event's own fields: `type` and `createdAt` are the event's, which a field of the payload would overwrite. */
export type EventPayload = Record<string, unknown> & { type?: never; createdAt?: never }

/** The JSON clients receive: type, createdAt (the change's time), then the payload's fields. */
export function eventData(type: EventType, at: Date, payload: EventPayload): string {
  return JSON.stringify({ type, createdAt: at.toISOString(), ...payload })
}

/**
 * Records events in the caller's transaction: they are delivered if and only if it commits.
 *
 * @example
 * await sql.begin(async tx => {
 *   await cancel(tx, subscriptionId)
 *   await enqueueEvents(tx, at, [{ userId: ownerId, type: 'subscription.cancelled', payload: { subscriptionId } }])
 * })
 */
export async function enqueueEvents(tx: Db, at: Date, events: NewEvent[]): Promise<void> {
  if (events.length === 0) return
  // Three array parameters however many events (a list of values would run out of parameters past
  // about 21,000, as when an agent with that many subscribers is deactivated), inserted in order.
  await tx`
    insert into outbox (user_id, type, data)
    select user_id, type, data
    from unnest(${events.map(e => e.userId)}::uuid[], ${events.map(e => e.type)}::text[], ${events.map(e => eventData(e.type, at, e.payload))}::text[])
      with ordinality as e(user_id, type, data, n)
    order by n
  `
}
