/**
 * PostgreSQL and Redis configured by others, under load with no fault: a role with settings a DBA
 * chose (isolation level, time zone, output formats, timeouts, messages in German) and a Redis
 * database other than 0 that closes clients idle for a second and publishes keyspace events. Every
 * check holds as on default servers (docs/operations.md, "The database's defaults").
 */
import { afterAll, beforeAll } from 'bun:test'
import { Redis } from 'ioredis'
import { createSql } from '../src/db.ts'
import { describeScenario } from './lib/scenario.ts'
import { startWorld, type World } from './lib/world.ts'

const roleSettings: Record<string, string> = {
  default_transaction_isolation: 'serializable',
  TimeZone: 'Pacific/Chatham',
  DateStyle: 'SQL, DMY',
  IntervalStyle: 'sql_standard',
  bytea_output: 'escape',
  extra_float_digits: '0',
  lock_timeout: '1s',
  idle_in_transaction_session_timeout: '5s',
  client_min_messages: 'debug5',
}

const redisSettings: [string, string][] = [
  ['timeout', '1'],
  ['tcp-keepalive', '0'],
  ['notify-keyspace-events', 'KEA'],
]

let world: World | undefined
beforeAll(async () => {
  // German messages without a German locale: gettext reads LANGUAGE unless lc_messages is C.
  world = await startWorld({ postgres: { settings: { lc_messages: 'C.UTF-8', log_statement: 'all' }, env: { LANGUAGE: 'de' } } })
  const admin = createSql(world.postgres.url(), { max: 1 })
  try {
    for (const [name, value] of Object.entries(roleSettings)) await admin.unsafe(`alter role postgres set ${name} = '${value}'`)
  } finally {
    await admin.end()
  }
  const redis = new Redis(world.redis.url)
  try {
    for (const [name, value] of redisSettings) await redis.config('SET', name, value)
  } finally {
    redis.disconnect()
  }
})
afterAll(async () => {
  await world?.close()
})

describeScenario(
  'PostgreSQL and Redis configured by others',
  () => {
    if (!world) throw new Error('the servers did not start (see the error of beforeAll)')
    return { ...world, redis: { ...world.redis, url: `${world.redis.url}/3` } }
  },
  {
    slug: 'settings',
    async fault() {
      await Bun.sleep(5000)
      const at = Date.now()
      return { label: 'none: the settings are the test', restarted: 'nothing', upMeans: 'was never down', downAt: at, upAt: at }
    },
  },
)
