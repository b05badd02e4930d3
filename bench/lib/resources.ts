/** What a scenario costs outside the service's processes: Redis commands and CPU, PostgreSQL transactions and backend CPU. */
import { readdirSync, readFileSync } from 'node:fs'
import type { World } from './world.ts'

export interface Resources {
  redisCommands: number
  redisCpuSeconds: number
  pgTransactions: number
  pgCpuSeconds: number
  /** Each backend's CPU seconds so far, by pid and start time (a pid may be reused): a difference counts only what each did in between. */
  pgBackends: Map<string, number>
}

export async function resources(world: World): Promise<Resources> {
  const stats = await world.redis.info('commandstats')
  const cpu = await world.redis.info('cpu')
  let redisCommands = 0
  for (const match of stats.matchAll(/calls=(\d+)/g)) redisCommands += Number(match[1])
  const field = (name: string) => Number(new RegExp(`${name}:([\\d.]+)`).exec(cpu)?.[1] ?? 0)
  // Statistics are flushed by backends now and then; a fresh snapshot reads what has been flushed.
  await world.sql`select pg_stat_clear_snapshot()`
  const [row] = await world.sql<{ n: number }[]>`
    select (xact_commit + xact_rollback)::int as n from pg_stat_database where datname = current_database()
  `
  const pgBackends = backendsCpu(world.database)
  return {
    redisCommands,
    redisCpuSeconds: field('used_cpu_sys') + field('used_cpu_user'),
    pgTransactions: row!.n,
    pgCpuSeconds: [...pgBackends.values()].reduce((sum, seconds) => sum + seconds, 0),
    pgBackends,
  }
}

/**
 * What was used between two readings. Postgres's CPU is summed backend by backend: one that ended in
 * between (a pool's idle connection closed) would otherwise take its whole past off the total, and
 * one that began counts from its start. What a backend did before it ended is lost (it is small).
 */
export function difference(after: Resources, before: Resources): Resources {
  let pgCpuSeconds = 0
  for (const [backend, seconds] of after.pgBackends) pgCpuSeconds += seconds - (before.pgBackends.get(backend) ?? 0)
  return {
    redisCommands: after.redisCommands - before.redisCommands,
    redisCpuSeconds: after.redisCpuSeconds - before.redisCpuSeconds,
    pgTransactions: after.pgTransactions - before.pgTransactions,
    pgCpuSeconds,
    pgBackends: after.pgBackends,
  }
}

/** CPU seconds of each PostgreSQL backend connected to `database` (its title names it), by pid and start time. */
function backendsCpu(database: string): Map<string, number> {
  const seconds = new Map<string, number>()
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue
    try {
      const title = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      if (!title.startsWith('postgres:') || !title.includes(` ${database} `)) continue
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
      // utime and stime (fields 14 and 15 of the line), starttime (22): a new backend under an old pid is another.
      seconds.set(`${pid}@${fields[19]}`, (Number(fields[11]) + Number(fields[12])) / 100)
    } catch {
      // gone meanwhile
    }
  }
  return seconds
}
