/**
 * Disks that fill up under load, then get room again: PostgreSQL's data directory (a table cannot
 * grow: 53100), its WAL (PostgreSQL PANICs and, unable to recover without room for WAL, shuts down
 * until started again), and Redis's directory with an append-only file or with snapshots (writes
 * refused with MISCONF until Redis writes its file again). Each disk is a tmpfs of the file's own,
 * filled to the last byte for a while and then freed; mounting needs root, and the file is skipped
 * without it.
 */
import { afterAll, beforeAll, describe, test } from 'bun:test'
import { Redis } from 'ioredis'
import { createSql } from '../src/db.ts'
import { countUsageRecordedBefore, prepareTemplate, type Deployment } from './lib/deployment.ts'
import { describeScenario } from './lib/scenario.ts'
import type { FaultTimes } from './lib/scenario-run.ts'
import type { World } from './lib/world.ts'
import { startPostgresServer } from '../test/helpers/postgres-server.ts'
import { startRedisServer } from '../test/helpers/redis-server.ts'
import { smallDisk, smallDiskRefused, type SmallDisk } from '../test/helpers/small-disk.ts'
import { startUpstream } from '../test/helpers/upstream.ts'

const fullForMs = 8000

interface DiskWorld extends World {
  disks: { pgData: SmallDisk; pgWal: SmallDisk; redis: SmallDisk }
}

/** Servers whose directories are small disks: PostgreSQL's data and its WAL apart, and Redis's. */
async function startDiskWorld(redisPersistence: 'aof' | 'rdb'): Promise<DiskWorld> {
  const taken: SmallDisk[] = []
  const take = (size: string, owner?: string) => {
    const disk = smallDisk(size, owner)
    if (disk === null) throw new Error('could not mount a tmpfs')
    taken.push(disk)
    return disk
  }
  try {
    const disks = { pgData: take('256m', 'postgres'), pgWal: take('256m', 'postgres'), redis: take('64m') }
    const [postgres, redis] = await Promise.all([
      startPostgresServer({ maxConnections: 300, dataDir: disks.pgData.dir, walDir: disks.pgWal.dir, walSegmentMb: 1 }),
      startRedisServer({ dir: disks.redis.dir, persistence: redisPersistence }),
    ])
    const upstream = startUpstream()
    const world: DiskWorld = {
      postgres,
      redis,
      upstream,
      disks,
      async close() {
        upstream.stop()
        await Promise.all([redis.close(), postgres.stop()])
        for (const disk of taken) disk.remove()
      },
    }
    await prepareTemplate(postgres)
    // Few WAL segments kept for reuse, so that a full WAL disk is met within seconds, as a longer load would.
    const admin = createSql(postgres.url(), { max: 1 })
    try {
      await admin`alter system set min_wal_size = '2MB'`
      await admin`alter system set max_wal_size = '4MB'`
      await admin`select pg_reload_conf()`
    } finally {
      await admin.end()
    }
    return world
  } catch (error) {
    for (const disk of taken) disk.remove()
    throw error
  }
}

function useDiskWorld(redisPersistence: 'aof' | 'rdb'): () => DiskWorld {
  let world: DiskWorld | undefined
  beforeAll(async () => {
    world = await startDiskWorld(redisPersistence)
  }, 60_000)
  afterAll(async () => {
    await world?.close()
  })
  return () => {
    if (!world) throw new Error('the servers did not start (see the error of beforeAll)')
    return world
  }
}

/**
 * Fills `disk`, runs `meanwhile`, frees it after `fullForMs`; `recover` resolves with when what was
 * stopped serves again (default: the moment the disk had room).
 */
async function fullFor(
  disk: SmallDisk,
  what: string,
  options: { meanwhile?: () => Promise<void>; recover?: () => Promise<number>; upMeans?: string } = {},
): Promise<FaultTimes> {
  const downAt = Date.now()
  disk.fill()
  await options.meanwhile?.()
  await Bun.sleep(Math.max(0, downAt + fullForMs - Date.now()))
  disk.free()
  const freedAt = Date.now()
  const upAt = options.recover ? await options.recover() : freedAt
  return { label: `${what} full for ${fullForMs} ms`, restarted: what, upMeans: options.upMeans ?? 'had room again', downAt, upAt }
}

/** Moves to new WAL segments until the server cannot make one (it PANICs), as a longer load would. */
async function exhaustWal(world: World): Promise<void> {
  const admin = createSql(world.postgres.url(), { max: 1 })
  try {
    for (let i = 0; i < 50; i++) await admin`select pg_switch_wal(), txid_current()`
    throw new Error('PostgreSQL made 50 WAL segments on a full disk')
  } catch (error) {
    if ((error as Error).message.startsWith('PostgreSQL made')) throw error
  } finally {
    await admin.end({ timeout: 1 })
  }
}

/**
 * Resolves with the first moment Redis took a write again (it refuses them until it has written its
 * file). A proxy call answered as the fault began may have had its metering job refused: its usage,
 * recorded in Postgres, is maintenance's to count a minute later; that pass is run here, once
 * Redis is back, rather than waited for beyond the checks' patience.
 */
async function redisTakesWrites(world: World, deployment: Deployment): Promise<number> {
  const redis = new Redis(world.redis.url, { maxRetriesPerRequest: 1 })
  let back: number
  try {
    for (;;) {
      const began = Date.now()
      if ((await redis.set(`${deployment.redisPrefix}disk-probe`, '1').catch(() => null)) === 'OK') {
        back = began
        break
      }
      await Bun.sleep(20)
    }
  } finally {
    redis.disconnect()
  }
  await countUsageRecordedBefore(deployment, back)
  return back
}

if (smallDiskRefused !== null) {
  test.skip(`disks that fill up (skipped: ${smallDiskRefused})`, () => {})
} else {
  describe('PostgreSQL and Redis (append-only file) on small disks', () => {
    const servers = useDiskWorld('aof')
    describeScenario('PostgreSQL’s data directory full', servers, {
      slug: 'pg-data-full',
      fault: () => fullFor(servers().disks.pgData, 'PostgreSQL’s data disk'),
    })
    // PostgreSQL 15 does not come back by itself: its crash recovery needs room for WAL, and fails,
    // and the server shuts down. Started again once there is room, as an operator or supervisor would.
    describeScenario('PostgreSQL’s WAL full', servers, {
      slug: 'pg-wal-full',
      fault: world =>
        fullFor(servers().disks.pgWal, 'PostgreSQL’s WAL disk', {
          meanwhile: () => exhaustWal(world),
          recover: async () => (await world.postgres.restart()).upAt,
          upMeans: 'had room and PostgreSQL accepted connections again',
        }),
    })
    describeScenario('Redis’s append-only file on a full disk', servers, {
      slug: 'redis-aof-full',
      fault: (world, deployment) =>
        fullFor(servers().disks.redis, 'Redis’s disk', {
          recover: () => redisTakesWrites(world, deployment),
          upMeans: 'had room and Redis took writes again',
        }),
    })
  })
  describe('Redis with snapshots on a small disk', () => {
    const servers = useDiskWorld('rdb')
    // Redis tries a failed snapshot again 5 s later, and refuses writes (MISCONF) until one is saved.
    describeScenario('Redis’s snapshots on a full disk', servers, {
      slug: 'redis-rdb-full',
      fault: (world, deployment) =>
        fullFor(servers().disks.redis, 'Redis’s disk', {
          recover: () => redisTakesWrites(world, deployment),
          upMeans: 'had room and Redis took writes again',
        }),
    })
  })
}
