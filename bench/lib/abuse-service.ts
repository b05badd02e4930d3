/** The service under attack: an API process (pinned to core 1) and a workers process, with the service's default limits. */
import { Queue } from 'bullmq'
import { Redis } from 'ioredis'
import { spawnBun, waitHealthy, type Server } from './proc.ts'
import type { World } from './world.ts'

export interface Service {
  api: Server
  workers: Server
  /** Stops both; resolves with the names of those that did not exit with 0. */
  stop(): Promise<string[]>
}

/**
 * The run's environment less its `RATE_LIMITS` (the load bench lifts some for its own load; here every
 * caller gets the defaults), with the slow upstream's host allowed for proxy calls.
 */
export function serviceEnv(world: World, port: number): Record<string, string> {
  const { RATE_LIMITS: _lifted, ...env } = world.env
  return { ...env, PORT: String(port), PROXY_ALLOWED_HOSTS: '127.0.0.1' }
}

export async function startService(world: World, port: number): Promise<Service> {
  const env = serviceEnv(world, port)
  // The service migrates the fresh database as it starts.
  const api = spawnBun('abuse-api', ['src/main.ts', '--api'], env, { cpu: 1, port, role: 'api' })
  let workers: Server | undefined
  try {
    await waitHealthy(api)
    workers = spawnBun('abuse-workers', ['src/main.ts', '--workers'], env, { role: 'workers' })
    await waitForWorkers(world, workers)
  } catch (error) {
    await api.stop()
    await workers?.stop()
    throw error
  }
  const started = workers
  return {
    api,
    workers: started,
    async stop() {
      const failed: string[] = []
      for (const server of [api, started]) if ((await server.stop()) !== 0) failed.push(server.name)
      return failed
    },
  }
}

/** A workers process is ready once BullMQ sees a worker on the invoices queue. */
async function waitForWorkers(world: World, workers: Server): Promise<void> {
  const connection = new Redis(world.env.REDIS_URL!, { maxRetriesPerRequest: null })
  const queue = new Queue('invoices', { connection, prefix: `${world.redisPrefix}bull` })
  try {
    const deadline = Date.now() + 60_000
    while ((await queue.getWorkersCount()) === 0) {
      if (workers.proc.exitCode !== null) throw new Error(`workers exited with ${workers.proc.exitCode}; see bench/.out/${workers.name}.log`)
      if (Date.now() > deadline) throw new Error('no worker on the invoices queue within 60 s')
      await Bun.sleep(100)
    }
  } finally {
    await queue.close()
    connection.disconnect()
  }
}
