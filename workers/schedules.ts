/**
 * The repeatable jobs (maintenance, the invoice run, the blog sweep), kept in Redis as BullMQ job
 * schedulers. Redis losing its data loses them, so the workers assert them again whenever their Redis
 * connection becomes ready and on a timer, never only at start; an upsert of one already there
 * changes nothing.
 */
import type { Queue } from 'bullmq'
import type { Redis } from '../src/redis.ts'
import { errorFields, type Log } from '../src/log.ts'

export interface Schedule {
  queue: Queue
  /** The scheduler's id in its queue. */
  id: string
  /** The name of the jobs it makes (what the worker switches on). */
  job: string
  everyMs: number
}

/** How often the schedules are asserted even without a reconnect (a Redis that restarted empty faster than a ping). */
export const scheduleCheckEveryMs = 10_000

/**
 * A scheduled job's finished record is kept an hour (a job every 2 s kept for ever would be 50 MB a
 * day), a failed one a week, as the blog's publish jobs keep theirs. Both rules trim the queue's
 * whole finished set by age, so they cut nothing the queue's other jobs keep longer.
 */
export const scheduledJobOptions = { removeOnComplete: { age: 3600 }, removeOnFail: { age: 7 * 86_400 } }

/**
 * How far past one interval a schedule's next run may lie before it is taken for one set by a clock
 * since stepped back, and made again: beyond any difference between the workers' clocks.
 */
export const clockStepMs = 60_000

/**
 * Upserts each schedule. BullMQ keeps a schedule's next run as it was set, by the clock of the
 * process that set it: after the clock stepped back an hour (NTP correcting the host, a VM resumed
 * from a snapshot) it is an hour away, and the maintenance, the invoice run and the blog sweep would
 * wait that hour. Such a schedule is removed (with its waiting job) and made again.
 */
export async function upsertSchedules(schedules: Schedule[]): Promise<void> {
  const opts = scheduledJobOptions
  for (const { queue, id, job, everyMs } of schedules) {
    const next = (await queue.getJobScheduler(id))?.next
    if (next !== undefined && next > Date.now() + everyMs + clockStepMs) await queue.removeJobScheduler(id)
    await queue.upsertJobScheduler(id, { every: everyMs }, { name: job, opts })
  }
}

/**
 * Upserts the schedules now (waiting for Redis, as BullMQ's connections do), then keeps them: on
 * every `ready` of `connection` (a reconnect) and every `scheduleCheckEveryMs`. An assertion that fails
 * once they are stopped (the connections closed under it by a shutdown) is a `debug` line, not a warning.
 *
 * @example
 * const kept = await keepSchedules([{ queue, id: 'maintenance', job: 'maintenance', everyMs: 60_000 }], redis, log)
 * kept.stop()
 */
export async function keepSchedules(schedules: Schedule[], connection: Redis, log: Log, everyMs = scheduleCheckEveryMs): Promise<{ stop(): void }> {
  await upsertSchedules(schedules)
  let running: Promise<void> | undefined
  let stopped = false
  const assert = () => {
    running ??= upsertSchedules(schedules)
      .catch(error => {
        // Stopped (a shutdown closing the connections under an assertion waiting for Redis): nothing
        // failed that was still wanted, nor is it tried again.
        if (stopped) log.debug('job schedules not asserted: stopped', errorFields(error))
        else log.warn('job schedules not asserted; trying again', errorFields(error))
      })
      .finally(() => (running = undefined))
  }
  connection.on('ready', assert)
  const timer = setInterval(assert, everyMs)
  timer.unref()
  return {
    stop() {
      stopped = true
      clearInterval(timer)
      connection.off('ready', assert)
    },
  }
}
