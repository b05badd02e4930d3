/**
 * Check: the workers' job schedulers (`maintenance`, `invoice-run`, `blog-sweep`: see
 * workers/index.ts) are in Redis, each with a job waiting for its next run, within a few seconds of
 * the restarted server accepting connections; after Redis lost its data that means upserted again.
 */
import { Queue } from 'bullmq'
import { Redis } from 'ioredis'
import { backMoment, type ScenarioRun } from './scenario-run.ts'

export const schedulers = [
  { queue: 'maintenance', id: 'maintenance' },
  { queue: 'invoices', id: 'invoice-run' },
  { queue: 'blog', id: 'blog-sweep' },
]

/** "A few seconds": how long after the restarted server accepts connections the schedulers must be back. */
export const schedulersWithinMs = 5000

export interface SchedulerWatch {
  /** When all three were first seen in place, if they were. */
  backAt?: number
  /** What the last look found, for a report. */
  seen: string
}

/** Looks every 100 ms for up to `ms` until every scheduler and its next job are in Redis. */
export async function watchSchedulers(redisUrl: string, prefix: string, ms: number): Promise<SchedulerWatch> {
  const connection = new Redis(redisUrl, { maxRetriesPerRequest: 1, connectTimeout: 1000 })
  connection.on('error', () => {})
  const queues = schedulers.map(({ queue, id }) => ({ id, queue: new Queue(queue, { connection, prefix: `${prefix}bull` }) }))
  for (const { queue } of queues) queue.on('error', () => {})
  const deadline = Date.now() + ms
  let seen = 'nothing read yet'
  try {
    while (Date.now() < deadline) {
      const began = Date.now()
      try {
        const states = await Promise.all(
          queues.map(async ({ id, queue }) => {
            const scheduler = await queue.getJobScheduler(id)
            const jobs = await queue.getJobs(['delayed', 'wait', 'active', 'prioritized'], 0, 200)
            const next = jobs.some(job => job.repeatJobKey === id)
            return { id, scheduler: scheduler !== undefined, next }
          }),
        )
        seen = states
          .map(s => `${s.id}: ${s.scheduler ? 'scheduler present' : 'no scheduler'}, ${s.next ? 'next job queued' : 'no job queued'}`)
          .join('; ')
        if (states.every(s => s.scheduler && s.next)) return { backAt: began, seen }
      } catch (error) {
        seen = `Redis not readable: ${(error as Error).message}`
      }
      await Bun.sleep(100)
    }
    return { seen }
  } finally {
    await Promise.all(queues.map(({ queue }) => queue.close().catch(() => {})))
    connection.disconnect()
  }
}

export function checkSchedulers(run: ScenarioRun): string[] {
  const { fault } = run
  if (run.schedulersBackAt === undefined) {
    return [`the job schedulers were not all back within the watch after ${backMoment(run)}; last seen: ${run.schedulersSeen}`]
  }
  const took = Math.max(0, run.schedulersBackAt - fault.upAt)
  if (took > schedulersWithinMs) {
    return [`the job schedulers were back ${took} ms after ${backMoment(run)}, more than ${schedulersWithinMs} ms`]
  }
  return []
}
