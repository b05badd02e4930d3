/** A fault test file's servers: its own PostgreSQL (with the migrated template), its own Redis, and the fake upstream. */
import { afterAll, beforeAll } from 'bun:test'
import { startUpstream, type Upstream } from '../../test/helpers/upstream.ts'
import { prepareTemplate } from './deployment.ts'
import { startPostgresServer, type PostgresServer, type PostgresServerOptions } from '../../test/helpers/postgres-server.ts'
import { startRedisServer, type RedisServer } from '../../test/helpers/redis-server.ts'

export interface World {
  postgres: PostgresServer
  redis: RedisServer
  upstream: Upstream
  close(): Promise<void>
}

/** `postgres`: options of its server (settings, environment) besides its connection limit. */
export async function startWorld(options: { postgres?: PostgresServerOptions } = {}): Promise<World> {
  const [postgres, redis] = await Promise.all([startPostgresServer({ maxConnections: 300, ...options.postgres }), startRedisServer()])
  const upstream = startUpstream()
  const world: World = {
    postgres,
    redis,
    upstream,
    async close() {
      upstream.stop()
      await Promise.all([redis.close(), postgres.stop()])
    },
  }
  try {
    await prepareTemplate(postgres)
  } catch (error) {
    await world.close()
    throw error
  }
  return world
}

/** Starts the file's servers before its tests and closes them after; returns their getter. */
export function useWorld(): () => World {
  let world: World | undefined
  beforeAll(async () => {
    world = await startWorld()
  })
  afterAll(async () => {
    await world?.close()
  })
  return () => {
    if (!world) throw new Error('the servers did not start (see the error of beforeAll)')
    return world
  }
}
