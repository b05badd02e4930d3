/** What one load run measured (bench/lib/wrk.ts runs it), and several runs merged as one. */

export interface LoadResult {
  requests: number
  /** The run's length as wrk measured it. */
  seconds: number
  rps: number
  /** Latencies from wrk's histogram (1 µs steps), ms. */
  p50: number
  p99: number
  max: number
  /** Responses by status code, where the run counted them (replies); otherwise only `failed` is known. */
  statuses?: Record<string, number>
  /** Responses with a status of 400 or more: wrk's own count, kept in every run. */
  failed: number
  /** Socket errors: connect, read, write, and requests that timed out. */
  socketErrors: number
  /** Latency quantiles [percent, ms], ascending, so runs can be merged. */
  quantiles: [number, number][]
  /** CPU seconds the generator (wrk) used. */
  generatorCpuSeconds: number
}

/** Responses not 2xx (from the counts by status where the run kept them) plus socket errors. */
export function non2xx(load: LoadResult): number {
  if (!load.statuses) return load.failed + load.socketErrors
  const bad = Object.entries(load.statuses).filter(([status]) => !status.startsWith('2'))
  return bad.reduce((sum, [, n]) => sum + n, 0) + load.socketErrors
}

/**
 * The p-percentile (0..100) of several runs' latencies together, from each run's quantiles weighted
 * by its requests: the smallest latency at which the runs' shares at or below it reach p.
 */
export function mergedPercentile(runs: LoadResult[], p: number): number {
  const total = runs.reduce((n, r) => n + r.requests, 0)
  if (total === 0) return 0
  const candidates = [...new Set(runs.flatMap(r => r.quantiles.map(([, value]) => value)))].sort((a, b) => a - b)
  const share = (value: number) =>
    runs.reduce((sum, r) => {
      let below = 0
      for (const [percent, v] of r.quantiles) if (v <= value) below = percent
      return sum + (r.requests * below) / 100
    }, 0) / total
  for (const value of candidates) if (share(value) >= p / 100 - 1e-9) return value
  return candidates[candidates.length - 1] ?? 0
}

/** Several runs as one: requests over their total time, percentiles of all their latencies. */
export function mergeLoads(runs: LoadResult[]): LoadResult {
  const sum = (pick: (r: LoadResult) => number) => runs.reduce((n, r) => n + pick(r), 0)
  const counted = runs.every(r => r.statuses)
  const statuses: Record<string, number> = {}
  if (counted) for (const r of runs) for (const [status, n] of Object.entries(r.statuses!)) statuses[status] = (statuses[status] ?? 0) + n
  const requests = sum(r => r.requests)
  const seconds = sum(r => r.seconds)
  const points = runs[0]?.quantiles.map(([percent]) => percent) ?? []
  return {
    requests,
    seconds,
    rps: requests / seconds,
    p50: mergedPercentile(runs, 50),
    p99: mergedPercentile(runs, 99),
    max: Math.max(0, ...runs.map(r => r.max)),
    statuses: counted ? statuses : undefined,
    failed: sum(r => r.failed),
    socketErrors: sum(r => r.socketErrors),
    quantiles: points.map(percent => [percent, mergedPercentile(runs, percent)]),
    generatorCpuSeconds: sum(r => r.generatorCpuSeconds),
  }
}
