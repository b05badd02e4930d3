/** What a scenario costs outside the service's processes: Redis commands and CPU, PostgreSQL transactions and backend CPU. */
import { readdirSync, readFileSync } from 'node:fs'
import type { World } from './world.ts'

export interface Resources {
  redisCommands: number
  redisCpuSeconds: number
  pgTransactions: number
  pgCpuSeconds: number
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
  return {
    redisCommands,
    redisCpuSeconds: field('used_cpu_sys') + field('used_cpu_user'),
    pgTransactions: row!.n,
    pgCpuSeconds: backendsCpu(world.database),
  }
}

export function difference(after: Resources, before: Resources): Resources {
  return {
    redisCommands: after.redisCommands - before.redisCommands,
    redisCpuSeconds: after.redisCpuSeconds - before.redisCpuSeconds,
    pgTransactions: after.pgTransactions - before.pgTransactions,
    pgCpuSeconds: after.pgCpuSeconds - before.pgCpuSeconds,
  }
}

/** CPU seconds of the PostgreSQL backends connected to `database` (their title names it). */
function backendsCpu(database: string): number {
  let seconds = 0
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue
    try {
      const title = readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      if (!title.startsWith('postgres:') || !title.includes(` ${database} `)) continue
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
      seconds += (Number(fields[11]) + Number(fields[12])) / 100
    } catch {
      // gone meanwhile
    }
  }
  return seconds
}
