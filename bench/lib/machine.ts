/** What the run ran on: cores, memory, CPU model, kernel, and the versions of everything measured. */
import { availableParallelism, cpus, release, totalmem } from 'node:os'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { World } from './world.ts'
import { root } from './proc.ts'

export interface Machine {
  cores: number
  memoryGiB: number
  cpu: string
  kernel: string
  /** This process's limit of open files (the streams scenario holds one socket per stream on each side). */
  openFiles: string
  versions: Record<string, string>
}

const packageVersion = (name: string) =>
  (JSON.parse(readFileSync(join(root, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version

/** `tools`: versions of what the bench ran beside the packages (wrk). */
export async function describeMachine(world: World, tools: Record<string, string>): Promise<Machine> {
  const [row] = await world.sql<{ version: string }[]>`select current_setting('server_version') as version`
  const info = await world.redis.info('server')
  return {
    cores: availableParallelism(),
    memoryGiB: totalmem() / 1024 ** 3,
    cpu: cpus()[0]?.model ?? 'unknown',
    kernel: release(),
    openFiles: /^Max open files\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? 'unknown',
    versions: {
      bun: Bun.version,
      elysia: packageVersion('elysia'),
      'postgres server': row?.version ?? 'unknown',
      'redis server': /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown',
      'postgres.js': packageVersion('postgres'),
      ioredis: packageVersion('ioredis'),
      bullmq: packageVersion('bullmq'),
      ...tools,
    },
  }
}
