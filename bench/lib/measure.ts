/** One measured load run with its servers watched, and turns of a scenario with the baseline between them. */
import { mergeLoads, runLoad, type LoadOptions } from './load.ts'
import { watch, type Server } from './proc.ts'
import type { LoadRun, ProcessFigures } from './types.ts'

export async function measure(url: string, next: LoadOptions['next'], connections: number, seconds: number, watched: Server[]): Promise<LoadRun> {
  const watching = watch(watched)
  const load = await runLoad({ url, connections, seconds, next })
  return { load, processes: watching.stop() }
}

/** Runs as one: loads merged, each process's peak the highest and its CPU the mean. */
export function mergeRuns(runs: LoadRun[]): LoadRun {
  const processes: Record<string, ProcessFigures> = {}
  for (const role of Object.keys(runs[0]?.processes ?? {})) {
    const figures = runs.map(run => run.processes[role]!)
    processes[role] = {
      peakMb: Math.max(...figures.map(f => f.peakMb)),
      cpu: figures.reduce((sum, f) => sum + f.cpu, 0) / figures.length,
    }
  }
  return { load: mergeLoads(runs.map(run => run.load)), processes }
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
