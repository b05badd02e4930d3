/** Load with autocannon's programmatic API; latencies kept exactly (autocannon's histogram rounds to 1 ms). */
import autocannon, { type Request } from 'autocannon'
import { percentile } from './stats.ts'

export interface LoadOptions {
  url: string
  connections: number
  seconds: number
  /** Builds each request: method, path, headers, body. */
  next: () => { method?: Request['method']; path: string; headers?: Record<string, string>; body?: string }
}

export interface LoadResult {
  requests: number
  rps: number
  p50: number
  p99: number
  max: number
  /** Responses by status code. */
  statuses: Record<string, number>
  errors: number
  timeouts: number
  seconds: number
  /** Every latency kept, ascending (ms), so runs can be merged. */
  samples: Float64Array
}

const maxKept = 2_000_000

export async function runLoad(options: LoadOptions): Promise<LoadResult> {
  const latencies = new Float64Array(maxKept)
  let kept = 0
  let seen = 0
  const statuses: Record<string, number> = {}
  const settings: autocannon.Options = {
    url: options.url,
    connections: options.connections,
    duration: options.seconds,
    timeout: 15,
    requests: [
      {
        setupRequest: (request: Request): Request => {
          const r = options.next()
          return { ...request, method: r.method ?? 'GET', path: r.path, headers: r.headers ?? {}, body: r.body }
        },
      },
    ],
  }
  let instance!: autocannon.Instance
  // The callback form returns the instance, whose 'response' events carry exact latencies.
  const done = new Promise<autocannon.Result>((resolve, reject) => {
    instance = autocannon(settings, (error, result) => (error ? reject(error) : resolve(result)))
  })
  instance.on('response', (_client, statusCode, _bytes, responseTime) => {
    statuses[statusCode] = (statuses[statusCode] ?? 0) + 1
    seen++
    if (kept < maxKept) latencies[kept++] = responseTime
    else {
      // Reservoir sampling keeps the distribution honest past the buffer.
      const slot = Math.floor(Math.random() * seen)
      if (slot < maxKept) latencies[slot] = responseTime
    }
  })
  const result = await done
  const sorted = latencies.subarray(0, kept).sort()
  return {
    requests: seen,
    rps: seen / options.seconds,
    p50: percentile(sorted, 0.5),
    p99: percentile(sorted, 0.99),
    max: sorted[sorted.length - 1] ?? 0,
    statuses,
    errors: result.errors,
    timeouts: result.timeouts,
    seconds: options.seconds,
    samples: sorted,
  }
}

/** Several runs as one: requests over their total time, percentiles of all their latencies. */
export function mergeLoads(runs: LoadResult[]): LoadResult {
  const samples = new Float64Array(runs.reduce((n, r) => n + r.samples.length, 0))
  let at = 0
  for (const run of runs) {
    samples.set(run.samples, at)
    at += run.samples.length
  }
  samples.sort()
  const statuses: Record<string, number> = {}
  for (const run of runs) for (const [status, count] of Object.entries(run.statuses)) statuses[status] = (statuses[status] ?? 0) + count
  const requests = runs.reduce((n, r) => n + r.requests, 0)
  const seconds = runs.reduce((n, r) => n + r.seconds, 0)
  return {
    requests,
    rps: requests / seconds,
    p50: percentile(samples, 0.5),
    p99: percentile(samples, 0.99),
    max: samples[samples.length - 1] ?? 0,
    statuses,
    errors: runs.reduce((n, r) => n + r.errors, 0),
    timeouts: runs.reduce((n, r) => n + r.timeouts, 0),
    seconds,
    samples,
  }
}
