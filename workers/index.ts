/** Starts every BullMQ worker, their repeatable schedules, the outbox relay and the actor runtime; `close` lets running jobs finish. */
import { Queue, Worker, type Job } from 'bullmq'
import { forInvoiceRun, forWorkers, relayEffects, type Deps } from '../src/deps.ts'
import { answers, closeRedis, createRedis, reportQueueErrors } from '../src/redis.ts'
import { errorFields, throttled } from '../src/log.ts'
import { maintenanceEveryMs, runMaintenance } from './maintenance.ts'
import { startActors } from './actors.ts'
import { meteringProcessor } from './metering.ts'
import { invoiceProcessor } from './invoices.ts'
import { queueNames } from '../src/queues.ts'
import { blogSweepEveryMs, blogWorker } from './blog.ts'
import { blogQueueName } from '../src/blog/queue.ts'
import { startRelay } from '../src/events/relay.ts'
import { keepSchedules } from './schedules.ts'

export interface Workers {
  close(): Promise<void>
}

export async function startWorkers(requestDeps: Deps): Promise<Workers> {
  const deps = forWorkers(requestDeps)
  const { config, keys, log } = deps
  const connection = createRedis(config.redisUrl, log, 'bullmq', 'workers')
  const options = { connection, prefix: keys.bullPrefix }

  const { queues } = deps
  // Publish jobs come from the API (deps.blogQueue); the sweep is the safety net for lost ones.
  const blog = new Queue(blogQueueName, options)
  reportQueueErrors(blog, log, { queue: blogQueueName })
  const schedules = await keepSchedules(
    [
      { queue: queues.maintenance, id: 'maintenance', job: 'maintenance', everyMs: maintenanceEveryMs },
      { queue: queues.invoices, id: 'invoice-run', job: 'invoice-run', everyMs: config.invoiceEveryMs },
      { queue: blog, id: 'blog-sweep', job: 'sweep', everyMs: blogSweepEveryMs },
    ],
    deps.redis,
    log,
  )

  const held = { lockDuration: config.queueLockMs, stalledInterval: config.queueLockMs }
  const workers = [
    new Worker(queueNames.maintenance, () => runMaintenance(deps), { ...options, concurrency: 1 }),
    new Worker(queueNames.metering, meteringProcessor(deps), { ...options, ...held, concurrency: 16 }),
    new Worker(queueNames.invoices, invoiceProcessor(forInvoiceRun(deps)), { ...options, ...held, concurrency: 1 }),
    blogWorker(deps, connection),
  ]
  deps.metrics.watchRedis(connection)
  // Attempts failing alike (every blog sweep, 2 s apart, while Postgres is down) are one record per
  // queue and error each 10 s, with how many were held back; the metrics count every one.
  const failed = throttled(log, 10_000)
  for (const worker of workers) {
    worker.on('completed', job => deps.metrics.jobFinished(worker.name, 'completed', runningMs(job)))
    worker.on('failed', (job, error) => {
      deps.metrics.jobFinished(worker.name, 'failed', job ? runningMs(job) : 0)
      failed('warn', `${worker.name}: ${error.message}`, 'job failed', { queue: worker.name, job: job?.id, ...errorFields(error) })
    })
    reportQueueErrors(worker, log, { worker: worker.name })
  }
  const relay = startRelay({ ...deps, effects: relayEffects(deps) })
  const actors = await startActors(deps)
  log.info('workers started', { queues: workers.map(worker => worker.name), actorRuntime: actors.id })

  return {
    async close() {
      schedules.stop()
      await actors.stop()
      // With Redis away, a job's last commands wait in the connection's offline queue for a Redis that
      // may not come back, and each worker waits for its jobs: ended, they fail, and the workers close
      // (their jobs are taken again once their locks run out, as after a crash). So with a Redis that
      // is paused or cut off by the network, whose connections stay ready: unanswered, the workers
      // close without waiting for their jobs (whose end Redis could not record) nor for their blocking
      // connections' end, which ioredis waits for from a Redis that sends nothing.
      const answering = await answers(connection)
      if (!answering) connection.disconnect()
      await Promise.all(workers.map(worker => worker.close(!answering)))
      await relay.stop()
      await blog.close()
      await closeRedis(connection)
    },
  }
}

/** How long a job's attempt ran: from when a worker took it to when it finished. */
function runningMs(job: Job): number {
  const end = job.finishedOn ?? Date.now()
  return job.processedOn === undefined ? 0 : end - job.processedOn
}
