/** Starts every BullMQ worker and its repeatable schedules; `close` lets running jobs finish. */
import { Queue, Worker } from 'bullmq'
import type { Deps } from '../src/deps.ts'
import { createRedis } from '../src/redis.ts'
import { errorFields } from '../src/log.ts'
import { maintenanceEveryMs, maintenanceQueue, runMaintenance } from './maintenance.ts'
import { startActors } from './actors.ts'
import { blogSweepEveryMs, blogWorker } from './blog.ts'
import { blogQueueName } from '../src/blog/queue.ts'

export interface Workers {
  close(): Promise<void>
}

export async function startWorkers(deps: Deps): Promise<Workers> {
  const { config, keys, log } = deps
  const connection = createRedis(config.redisUrl, log, 'bullmq')
  const options = { connection, prefix: keys.bullPrefix }

  const maintenance = new Queue(maintenanceQueue, options)
  await maintenance.upsertJobScheduler('maintenance', { every: maintenanceEveryMs }, { name: 'maintenance' })
  // Publish jobs come from the API (deps.blogQueue); the sweep is the safety net for lost ones.
  const blog = new Queue(blogQueueName, options)
  await blog.upsertJobScheduler('blog-sweep', { every: blogSweepEveryMs }, { name: 'sweep' })

  const workers = [
    new Worker(maintenanceQueue, () => runMaintenance(deps), { ...options, concurrency: 1 }),
    blogWorker(deps, connection),
  ]
  for (const worker of workers) {
    worker.on('failed', (job, error) => log.warn('job failed', { queue: worker.name, job: job?.id, ...errorFields(error) }))
    worker.on('error', error => log.warn('worker error', { queue: worker.name, ...errorFields(error) }))
  }
  const actors = await startActors(deps)
  log.info('workers started', { queues: workers.map(worker => worker.name), actorRuntime: actors.id })

  return {
    async close() {
      await actors.stop()
      await Promise.all(workers.map(worker => worker.close()))
      await maintenance.close()
      await blog.close()
      await connection.quit().catch(() => connection.disconnect())
    },
  }
}
