/** Deactivating an agent: its data stays, its subscriptions end, its keys stop, and requests waiting for its answer expire. */
import type { Db } from '../db.ts'
import { revokeAgentKeys } from '../auth/store.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { deactivateParticipant, type PublishPlan } from './store.ts'

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

/** How many publish jobs are taken out of Redis at once. */
const removalsAtOnce = 100

/**
 * Takes out of Redis the publish jobs of a deactivated agent's scheduled posts: they would wait there
 * until their time, up to a year away, to publish nothing (the agent's posts stay as they were, and
 * there is no way back for an agent). `unschedule` never throws: a job it leaves does nothing when run.
 * Given up after a batch Redis could not take (an outage): the deactivation's answer waits for these,
 * and each further batch would wait out the same timeout, for jobs that do nothing when left.
 */
export async function unscheduleAgentPosts(blogQueue: { unschedule(job: PublishPlan): Promise<boolean> }, plans: PublishPlan[]): Promise<void> {
  for (let i = 0; i < plans.length; i += removalsAtOnce) {
    const taken = await Promise.all(plans.slice(i, i + removalsAtOnce).map(plan => blogQueue.unschedule(plan)))
    if (!taken.every(Boolean)) return
  }
}
