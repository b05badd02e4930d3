/**
 * The process's Prometheus metrics (prom-client), one registry per createDeps. What is counted as it
 * happens is recorded through the functions here; what is read when scraped is in collectors.ts.
 * Label values are fixed names (route templates, methods, statuses, queues, connections), never an
 * id, a key or a token.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client'
import type { Redis } from '../redis.ts'

/** Seconds: the poll answers in a millisecond or two; a proxy call may wait for its upstream for 10 s. */
const httpBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
const jobBuckets = [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900]

export type Metrics = ReturnType<typeof createMetrics>

/**
 * prom-client's process metrics that say nothing true under Bun, left out: `nodejs_active_*` (Bun
 * answers the calls they read, process._getActiveHandles and the like, with nothing: always 0; and
 * gauges named _total fail `promtool check metrics`, prometheus/client_js#283), V8's heap spaces
 * (JavaScriptCore has none: 0, or the whole heap's size in one of them), and `process_heap_bytes`
 * (VmData, gigabytes of address space JavaScriptCore reserves, not used).
 */
const untrueUnderBun = [
  ...['handles', 'requests', 'resources'].flatMap(kind => [`nodejs_active_${kind}`, `nodejs_active_${kind}_total`]),
  'nodejs_heap_space_size_total_bytes',
  'nodejs_heap_space_size_used_bytes',
  'nodejs_heap_space_size_available_bytes',
  'process_heap_bytes',
]

/**
 * @example
 * const metrics = createMetrics({ process: true })
 * metrics.jobFinished('metering', 'completed', 12)
 */
export function createMetrics(options: { process: boolean }) {
  const registry = new Registry()
  // CPU, memory, file descriptors, event-loop lag: only where metrics are served (its event-loop
  // monitor would run in every test otherwise).
  if (options.process) {
    collectDefaultMetrics({ register: registry })
    for (const name of untrueUnderBun) registry.removeSingleMetric(name)
  }
  const registers = [registry]

  const httpDuration = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'HTTP requests by route template (unmatched: no route, or refused before routing), method and status; _count is the number of requests',
    labelNames: ['route', 'method', 'status'] as const,
    buckets: httpBuckets,
    registers,
  })
  const jobDuration = new Histogram({
    name: 'queue_job_duration_seconds',
    help: 'BullMQ jobs this process worked, by queue and outcome (completed, failed: an attempt that failed, retried or not)',
    labelNames: ['queue', 'outcome'] as const,
    buckets: jobBuckets,
    registers,
  })
  const jobFailures = new Counter({
    name: 'queue_job_failures_total',
    help: 'Attempts of BullMQ jobs that failed in this process, by queue',
    labelNames: ['queue'] as const,
    registers,
  })
  const invoiceRuns = new Counter({
    name: 'invoice_runs_total',
    help: 'Invoice runs this process finished, by outcome (completed, failed)',
    labelNames: ['outcome'] as const,
    registers,
  })
  const invoicesIssued = new Counter({ name: 'invoices_issued_total', help: 'Invoices this process issued', registers })
  const invoicesDue = new Gauge({
    name: 'invoice_run_due_periods',
    help: 'Ended periods the running invoice run has yet to invoice (0 when none runs)',
    registers,
  })

  const deadLetters = new Counter({
    name: 'actor_dead_letters_total',
    help: "Actor commands this process moved to their actor's dead-letter stream after failing five times, by command type",
    labelNames: ['type'] as const,
    registers,
  })

  const connections = new Set<Redis>()
  const beforeScrape: (() => Promise<void>)[] = []

  return {
    registry,
    httpDuration,
    /** The Redis connections whose state redis_connection_ready reports (see collectors.ts). */
    connections,
    watchRedis(redis: Redis) {
      connections.add(redis)
    },
    /** Reads a scrape-time source (collectors.ts) before each scrape, so that its metrics agree. */
    readBeforeScrape(read: () => Promise<void>) {
      beforeScrape.push(read)
    },
    jobFinished(queue: string, outcome: 'completed' | 'failed', durationMs: number) {
      jobDuration.observe({ queue, outcome }, Math.max(0, durationMs) / 1000)
      if (outcome === 'failed') jobFailures.inc({ queue })
    },
    /** A command moved to its actor's dead-letter stream (src/actors/careful.ts); its type is one of the code's command types. */
    deadLettered(type: string) {
      deadLetters.inc({ type })
    },
    /** One invoice run: its progress as it goes (runInvoices' onProgress), and its end. */
    invoiceRun() {
      let issued = 0
      return {
        progress(done: number, total: number) {
          invoicesIssued.inc(done - issued)
          issued = done
          invoicesDue.set(Math.max(0, total - done))
        },
        end(outcome: 'completed' | 'failed') {
          invoiceRuns.inc({ outcome })
          invoicesDue.set(0)
        },
      }
    },
    /** The Prometheus text of every metric, scrape-time collectors included. */
    async text(): Promise<{ body: string; contentType: string }> {
      await Promise.all(beforeScrape.map(read => read()))
      return { body: await registry.metrics(), contentType: registry.contentType }
    },
  }
}
