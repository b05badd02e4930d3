/** One measured load run with every process of the service watched, and turns of a scenario with the baseline between them. */
import { loadavg } from 'node:os'
import { mergeLoads } from './load.ts'
import { watch, type Server } from './proc.ts'
import { difference, resources } from './resources.ts'
import type { LoadRun, Settings } from './types.ts'
import type { World } from './world.ts'
import { runWrk, type Requests, type Taken } from './wrk.ts'

/** What every load run needs: the settings, the world, wrk and its core, the workers process. */
export interface Bench {
  settings: Settings
  world: World
  wrk: string
  /** The core wrk is pinned to, the servers being on the other; undefined when nothing is pinned. */
  generatorCpu?: number
  workers: Server
}

/** Load on `server` for `seconds`, unmeasured: warms the server, its caches and the generator's path. */
export async function warmUp(bench: Bench, server: Server, requests: Requests, seconds = bench.settings.warmSeconds): Promise<Taken> {
  const { settings } = bench
  const { taken } = await runWrk({ wrk: bench.wrk, url: server.url, requests, ...settings, seconds, cpu: bench.generatorCpu })
  return taken
}

/**
 * Load on `server` for `seconds`, with the CPU of every process involved: the server and the workers
 * (from /proc), the run's Postgres backends, Redis (its own count, every client's), and wrk.
 */
export async function measure(bench: Bench, server: Server, requests: Requests, seconds: number): Promise<{ run: LoadRun; taken: Taken }> {
  const { settings, world } = bench
  const before = await resources(world)
  const loadBefore = loadavg()[0]!
  const watching = watch([server, bench.workers])
  const { load, taken } = await runWrk({ wrk: bench.wrk, url: server.url, requests, ...settings, seconds, cpu: bench.generatorCpu })
  const watched = watching.stop()
  const used = difference(await resources(world), before)
  const cpuSeconds: Record<string, number> = { postgres: used.pgCpuSeconds, redis: used.redisCpuSeconds }
  const peakMb: Record<string, number> = {}
  for (const [role, figures] of Object.entries(watched.processes)) {
    cpuSeconds[role] = figures.cpuSeconds
    peakMb[role] = figures.peakMb
  }
  const counts = { redisCommands: used.redisCommands, pgTransactions: used.pgTransactions }
  const run: LoadRun = { load, server: server.role, cpuSeconds, counts, wallSeconds: watched.seconds, peakMb, loadavg: [loadBefore, loadavg()[0]!] }
  return { run, taken }
}

/** Runs as one: loads merged, CPU and time summed, each process's peak the highest, the rounds kept. */
export function mergeRuns(runs: LoadRun[]): LoadRun {
  const cpuSeconds: Record<string, number> = {}
  const peakMb: Record<string, number> = {}
  for (const run of runs) {
    for (const [role, seconds] of Object.entries(run.cpuSeconds)) cpuSeconds[role] = (cpuSeconds[role] ?? 0) + seconds
    for (const [role, mb] of Object.entries(run.peakMb)) peakMb[role] = Math.max(peakMb[role] ?? 0, mb)
  }
  return {
    load: mergeLoads(runs.map(run => run.load)),
    server: runs[0]!.server,
    cpuSeconds,
    counts: {
      redisCommands: runs.reduce((sum, run) => sum + run.counts.redisCommands, 0),
      pgTransactions: runs.reduce((sum, run) => sum + run.counts.pgTransactions, 0),
    },
    wallSeconds: runs.reduce((sum, run) => sum + run.wallSeconds, 0),
    peakMb,
    loadavg: [runs[0]!.loadavg[0], runs[runs.length - 1]!.loadavg[1]],
    rounds: runs,
  }
}

/**
 * `rounds` turns of the scenario, each after a baseline run: a slow or fast spell of a shared
 * machine then falls on both. Returns the scenario's runs merged and the baseline runs.
 */
export async function alternate(
  rounds: number,
  scenario: () => Promise<LoadRun>,
  baseline?: () => Promise<LoadRun>,
): Promise<{ run: LoadRun; baselines: LoadRun[] }> {
  const runs: LoadRun[] = []
  const baselines: LoadRun[] = []
  for (let i = 0; i < rounds; i++) {
    if (baseline) baselines.push(await baseline())
    runs.push(await scenario())
  }
  return { run: mergeRuns(runs), baselines }
}
