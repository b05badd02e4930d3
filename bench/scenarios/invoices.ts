/** Scenario 5, the invoice run: ended periods invoiced by the worker (a job on the invoices queue), then a run that issues nothing. */
import { Queue } from 'bullmq'
import { Redis } from 'ioredis'
import { queueNames } from '../../src/queues.ts'
import { seedEndedPeriods } from '../lib/seed-periods.ts'
import { watch, type Server } from '../lib/proc.ts'
import type { InvoiceRun } from '../lib/types.ts'
import type { World } from '../lib/world.ts'
import { redisUrl } from '../lib/world.ts'

export async function invoiceScenario(
  world: World,
  workers: Server,
  options: { periods: number; progress: (line: string) => void },
): Promise<InvoiceRun> {
  const { sql } = world
  const at = new Date()
  const seeding = performance.now()
  const periods = await seedEndedPeriods(sql, options.periods, at)
  const seedSeconds = (performance.now() - seeding) / 1000
  options.progress(`  seeded ${periods.toLocaleString('en-US')} ended periods in ${seedSeconds.toFixed(1)} s`)

  const connection = new Redis(redisUrl, { maxRetriesPerRequest: null })
  const queue = new Queue(queueNames.invoices, { connection, prefix: `${world.redisPrefix}bull` })
  const issued = async () => {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from invoices`
    return row!.n
  }
  try {
    // The scheduled run a worker starts with (nothing to bill then) must be over.
    await until(async () => {
      const counts = await queue.getJobCounts('active', 'waiting', 'prioritized')
      return counts.active! + counts.waiting! + counts.prioritized! === 0
    }, 30_000)

    const watching = watch([workers])
    const run = async (jobId: string, onTick?: (n: number) => void) => {
      const enqueued = Date.now()
      await queue.add('invoice-run', { at: at.toISOString() }, { jobId })
      let lastTick = 0
      for (;;) {
        const job = await queue.getJob(jobId)
        if (job?.failedReason) throw new Error(`invoice run failed: ${job.failedReason}`)
        if (job?.finishedOn) {
          const { issued } = job.returnvalue as { issued: number }
          return { issued, seconds: (job.finishedOn - enqueued) / 1000, processSeconds: (job.finishedOn - job.processedOn!) / 1000 }
        }
        if (onTick && Date.now() - lastTick > 2000) {
          lastTick = Date.now()
          onTick((Date.now() - enqueued) / 1000)
        }
        if (Date.now() - enqueued > 300_000) throw new Error('invoice run still going after 300 s')
        await Bun.sleep(50)
      }
    }
    const first = await run('bench-first', async seconds =>
      options.progress(`  ${seconds.toFixed(0)} s: ${(await issued()).toLocaleString('en-US')} invoices`),
    )
    const counted = await issued()
    options.progress(`  first run: ${first.issued.toLocaleString('en-US')} issued in ${first.seconds.toFixed(1)} s`)
    const second = await run('bench-second')
    options.progress(`  second run: ${second.issued} issued in ${second.seconds.toFixed(2)} s`)
    const workersPeakMb = watching.stop()[workers.name]!.peakMb
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
      workersPeakMb,
    }
  } finally {
    await queue.close()
    connection.disconnect()
  }
}

async function until(done: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`still waiting after ${ms} ms`)
    await Bun.sleep(100)
  }
}
