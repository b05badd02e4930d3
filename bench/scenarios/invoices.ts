/** Scenario 5, the invoice run: ended periods invoiced by the worker (a job on the invoices queue), then a run that issues nothing. */
import { Queue } from 'bullmq'
import { Redis } from 'ioredis'
import { queueNames } from '../../src/queues.ts'
import { clearBilling, seedEndedPeriods } from '../lib/seed-periods.ts'
import { watch, type Server } from '../lib/proc.ts'
import { difference, resources } from '../lib/resources.ts'
import type { InvoiceRun } from '../lib/types.ts'
import type { World } from '../lib/world.ts'
import { redisUrl } from '../lib/world.ts'

type Progress = (line: string) => void

/**
 * One size of the run: the billing tables emptied (of an earlier size, or the replies' subscriptions), `periods` ended periods
 * seeded, the run timed from its job's enqueueing to its end, its events relayed from the outbox, and
 * the CPU of the workers, Postgres and Redis over both; then a second run that must issue nothing.
 * A first run still going after 1 ms a period (and 2 minutes) is reported unfinished, without the rest.
 */
export async function invoiceScenario(world: World, workers: Server, options: { periods: number; progress: Progress }): Promise<InvoiceRun> {
  const { sql } = world
  const say = options.progress
  const connection = new Redis(redisUrl, { maxRetriesPerRequest: null })
  const queue = new Queue(queueNames.invoices, { connection, prefix: `${world.redisPrefix}bull` })
  // The scheduled run a worker starts with must be over before anything is seeded, or it bills the
  // seeded periods itself and the bench's run finds none (it happened).
  await until(async () => {
    const counts = await queue.getJobCounts('active', 'waiting', 'prioritized', 'completed', 'failed')
    return counts.active! + counts.waiting! + counts.prioritized! === 0 && counts.completed! + counts.failed! > 0
  }, 30_000).catch(async error => {
    await queue.close()
    connection.disconnect()
    throw error
  })
  await clearBilling(sql)
  const at = new Date()
  const seeding = performance.now()
  const periods = await seedEndedPeriods(sql, options.periods, at, `p${options.periods}`)
  const seedSeconds = (performance.now() - seeding) / 1000
  say(`  seeded ${periods.toLocaleString('en-US')} ended periods in ${seedSeconds.toFixed(1)} s`)

  const issued = async () => {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from invoices`
    return row!.n
  }
  // A million periods take minutes on a slow machine; stop waiting only far beyond that (1 ms a period).
  const limitMs = 120_000 + periods
  try {
    const before = await resources(world)
    const watching = watch([workers])
    const tick = async (seconds: number) => say(`  ${seconds.toFixed(0)} s: ${(await issued()).toLocaleString('en-US')} invoices`)
    const first = await runJob(queue, `bench-first-${options.periods}`, at, limitMs, issued, tick)
    const counted = await issued()
    if (!first.finished) {
      say(`  first run: ${first.issued.toLocaleString('en-US')} issued when the bench stopped waiting, after ${first.seconds.toFixed(0)} s`)
      const workersWatched = watching.stop().processes.workers!
      const used = difference(await resources(world), before)
      const cpuSeconds = { workers: workersWatched.cpuSeconds, postgres: used.pgCpuSeconds, redis: used.redisCpuSeconds }
      return { periods, seedSeconds, first: { ...first, counted }, duplicates: 0, workersPeakMb: workersWatched.peakMb, cpuSeconds }
    }
    say(`  first run: ${first.issued.toLocaleString('en-US')} issued in ${first.seconds.toFixed(1)} s`)
    const relaying = performance.now()
    await until(async () => {
      const [row] = await sql<{ n: number }[]>`select count(*)::int as n from outbox`
      return row!.n === 0
    }, limitMs)
    const relaySeconds = (performance.now() - relaying) / 1000
    const workersWatched = watching.stop().processes.workers!
    const used = difference(await resources(world), before)
    say(`  its events left the outbox ${relaySeconds.toFixed(1)} s after`)

    const second = await runJob(queue, `bench-second-${options.periods}`, at, limitMs, issued)
    say(`  second run: ${second.issued} issued in ${second.seconds.toFixed(2)} s`)
    const [dup] = await sql<{ n: number }[]>`
      select count(*)::int as n from (
        select subscription_id, period_index from invoices where subscription_id is not null group by 1, 2 having count(*) > 1
      ) d
    `
    return {
      periods,
      seedSeconds,
      first: { ...first, counted },
      second: { issued: second.issued, seconds: second.seconds },
      duplicates: dup!.n,
      workersPeakMb: workersWatched.peakMb,
      cpuSeconds: { workers: workersWatched.cpuSeconds, postgres: used.pgCpuSeconds, redis: used.redisCpuSeconds },
      relaySeconds,
    }
  } finally {
    await queue.close()
    connection.disconnect()
  }
}

/**
 * Enqueues an invoice run dated `at` and waits for its end, `onTick` every 2 s meanwhile; after
 * `limitMs` it stops waiting and answers with the invoices issued so far, unfinished.
 */
async function runJob(
  queue: Queue,
  jobId: string,
  at: Date,
  limitMs: number,
  issued: () => Promise<number>,
  onTick?: (seconds: number) => Promise<void>,
) {
  const enqueued = Date.now()
  await queue.add('invoice-run', { at: at.toISOString() }, { jobId })
  let lastTick = Date.now()
  for (;;) {
    const job = await queue.getJob(jobId)
    if (job?.failedReason) throw new Error(`invoice run failed: ${job.failedReason}`)
    if (job?.finishedOn) {
      const { issued } = job.returnvalue as { issued: number }
      return { issued, seconds: (job.finishedOn - enqueued) / 1000, processSeconds: (job.finishedOn - job.processedOn!) / 1000, finished: true }
    }
    if (onTick && Date.now() - lastTick > 2000) {
      lastTick = Date.now()
      await onTick((Date.now() - enqueued) / 1000)
    }
    if (Date.now() - enqueued > limitMs) {
      const seconds = (Date.now() - enqueued) / 1000
      return { issued: await issued(), seconds, processSeconds: job?.processedOn ? (Date.now() - job.processedOn) / 1000 : 0, finished: false }
    }
    await Bun.sleep(50)
  }
}

async function until(done: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`still waiting after ${ms} ms`)
    await Bun.sleep(100)
  }
}
