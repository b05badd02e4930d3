/** Runs one BullMQ worker of the service in the test process, against the test's queues. */
import { Worker, type Processor } from 'bullmq'
import type { Deps } from '../../src/deps.ts'
import { createRedis } from '../../src/redis.ts'

export async function startWorker(deps: Deps, queue: string, processor: Processor, concurrency = 8) {
  const connection = createRedis(deps.config.redisUrl, deps.log, 'bullmq')
  const worker = new Worker(queue, processor, { connection, prefix: deps.keys.bullPrefix, concurrency })
  await worker.waitUntilReady()
  return {
    async stop() {
      await worker.close()
      await connection.quit().catch(() => connection.disconnect())
    },
  }
}
