/** Deactivating an agent: its data stays, its subscriptions end, its keys stop, and requests waiting for its answer expire. */
import type { Db } from '../db.ts'
import { revokeAgentKeys } from '../auth/store.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { deactivateParticipant } from './store.ts'

/**
 * Deactivates the agent (the caller holds its row): each active subscription is cancelled, with the
 * `subscription.cancelled` event to the owner that a cancellation by its subscriber sends, and every
 * key is revoked. Returns the revoked keys' hashes, for the key cache.
 */
export async function deactivateAgent(tx: Db, agentId: string, ownerId: string, at: Date): Promise<Buffer[]> {
  const cancelled = await deactivateParticipant(tx, agentId, at)
  const events = cancelled.map(({ subscriptionId, planId, userId }) => ({
    userId: ownerId,
    type: 'subscription.cancelled' as const,
    payload: { subscriptionId, participantId: agentId, planId, userId },
  }))
  await enqueueEvents(tx, at, events)
  return revokeAgentKeys(tx, agentId)
}
