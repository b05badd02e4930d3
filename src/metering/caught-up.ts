/** Whether every usage event that happened before a moment has been counted (nothing older waits in the queue). */
import type { Queue } from 'bullmq'

const pendingStates = ['active', 'waiting', 'prioritized', 'delayed', 'waiting-children'] as const

/**
 * Jobs wait in arrival order, so looking at the oldest of each state is enough. Failed jobs (out of
 * retries) do not hold invoicing up; they are logged by the worker for an operator to retry.
 */
export async function meteringCaughtUp(queue: Queue, before: Date): Promise<boolean> {
  for (const state of pendingStates) {
    const jobs = await queue.getJobs([state], 0, 99, true)
    if (jobs.some(job => job && new Date((job.data as { occurredAt: string }).occurredAt) < before)) return false
  }
  return true
}
