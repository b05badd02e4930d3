/** The run's own world: a fresh database, a random Redis prefix and secrets, and their removal. */
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'
import { createSql, type Sql } from '../../src/db.ts'
import { deleteByPrefix } from '../../src/redis.ts'

export const adminUrl = process.env.BENCH_DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
export const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'

export interface World {
  database: string
  databaseUrl: string
  redisPrefix: string
  jwtSecret: string
  /** The service's environment (PORT added per process). */
  env: Record<string, string>
  /** A pool for seeding and checks. */
  sql: Sql
  redis: Redis
  destroy(): Promise<void>
}

export async function createWorld(): Promise<World> {
  const stamp = new Date().toISOString().replace(/[-:T]/g, '').slice(0, 14)
  const database = `bench_${stamp}_${randomBytes(3).toString('hex')}`
  const admin = createSql(adminUrl, { max: 1 })
  try {
    await dropStaleDatabases(admin)
    await admin`create database ${admin(database)}`
  } finally {
    await admin.end()
  }
  const url = new URL(adminUrl)
  url.pathname = `/${database}`
  const databaseUrl = url.toString()
  const redisPrefix = `bench:${randomBytes(6).toString('hex')}:`
  const jwtSecret = randomBytes(32).toString('hex')
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/tmp',
    NODE_ENV: 'production',
    LOG_LEVEL: 'warn',
    DATABASE_URL: databaseUrl,
    REDIS_URL: redisUrl,
    REDIS_PREFIX: redisPrefix,
    AUTH_JWT_SECRET: jwtSecret,
    CONNECTIONS_KEY: randomBytes(32).toString('hex'),
    // The streams scenario opens thousands of chat streams from one address (127.0.0.1): no cap.
    CHAT_STREAMS_PER_ADDRESS: '0',
    // World chat is posted to many times in the streams scenario.
    RATE_LIMITS: JSON.stringify({ chatPost: { capacity: 100_000, perSeconds: 1 }, replyPost: { capacity: 100_000, perSeconds: 1 } }),
    // The scheduled invoice run fires once at start (nothing to bill yet), then not again during the run.
    INVOICE_EVERY_MS: String(24 * 3_600_000),
    // As `npm start` runs the service (package.json), for every server of the run, the baseline's too:
    // Bun's allocator keeps the memory it freed for reuse instead of handing it back at once.
    MIMALLOC_PURGE_DELAY: process.env.MIMALLOC_PURGE_DELAY ?? '-1',
  }
  const sql = createSql(databaseUrl, { max: 4, applicationName: 'bench' })
  const redis = new Redis(redisUrl)
  return {
    database,
    databaseUrl,
    redisPrefix,
    jwtSecret,
    env,
    sql,
    redis,
    async destroy() {
      await sql.end({ timeout: 5 })
      const admin = createSql(adminUrl, { max: 1 })
      try {
        await admin`drop database if exists ${admin(database)} with (force)`
      } finally {
        await admin.end()
      }
      await deleteByPrefix(redis, redisPrefix)
      redis.disconnect()
    },
  }
}

/** Databases a killed run left behind, an hour old or more (the name carries the start time). */
async function dropStaleDatabases(admin: Sql): Promise<void> {
  const cutoff = new Date(Date.now() - 3_600_000).toISOString().replace(/[-:T]/g, '').slice(0, 14)
  const rows = await admin<{ datname: string }[]>`select datname from pg_database where datname ~ '^bench_[0-9]{14}_'`
  for (const { datname } of rows) {
    if (datname.slice(6, 20) < cutoff) await admin`drop database if exists ${admin(datname)} with (force)`
  }
}
