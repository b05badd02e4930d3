/** The figures the report derives from the runs: the baseline a run is compared with, CPU per request, the baseline's spread. */
import type { Machine } from './machine.ts'
import type { InvoiceRun, LoadRun, PollRun, ReplyRun, Settings, StreamsRun } from './types.ts'

export interface Results {
  date: Date
  machine: Machine
  settings: Settings
  pinned: boolean
  seconds: number
  /** The machine's 1, 5 and 15-minute load averages as the run began and as it ended. */
  loadavg: { start: number[]; end: number[] }
  baselines: LoadRun[]
  /** The poll at each number of agents, ascending; `sizes.agents` is the one of section 2. */
  polls: PollRun[]
  reply?: ReplyRun
  /** Replies that each answer a waiting conversation (3b). */
  replyWaiting?: ReplyRun
  /** Streams at each count, ascending; `sizes.streams` is the one of section 4. */
  streams: StreamsRun[]
  /** The invoice run at each number of periods, ascending; `sizes.periods` is the one of section 5. */
  invoices: InvoiceRun[]
  sizes: { agents: number; streams: number; periods: number }
  /** Hand-written notes (the profile, before/after) appended as they are. */
  notes: string
}

/** The baseline's variation between rounds above which a run says its ratios are unreliable. */
export const spreadLimit = 0.15

const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / Math.max(1, values.length)

/** The middle value (the mean of the middle two of an even count): one disturbed run moves it little. */
const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const half = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[half]! : mean(sorted.slice(half - 1, half + 1))
}

/** CPU µs a request of `role` (or of several roles together). */
export function cpuUs(run: LoadRun, ...roles: string[]): number {
  const seconds = roles.reduce((sum, role) => sum + (run.cpuSeconds[role] ?? 0), 0)
  return run.load.requests > 0 ? (seconds * 1e6) / run.load.requests : 0
}

/** Cores `role` used on average while measured. */
export const cores = (run: LoadRun, role: string) => (run.cpuSeconds[role] ?? 0) / run.wallSeconds

/**
 * The bare route's figures: the median of the given baseline runs of this run (all of them by
 * default), figure by figure, so that one run disturbed by something else on the host (a p99 four
 * times the others', say) does not flatter every ratio of its phase.
 */
export function baselineOf(results: Results, against?: number[]) {
  const picked = against?.length ? against.map(i => results.baselines[i]!).filter(Boolean) : results.baselines
  const runs = picked.length > 0 ? picked : results.baselines
  return {
    runs,
    rps: median(runs.map(r => r.load.rps)),
    p50: median(runs.map(r => r.load.p50)),
    p99: median(runs.map(r => r.load.p99)),
    peakMb: Math.max(0, ...runs.map(r => r.peakMb.baseline ?? 0)),
    /** The bare route's server CPU per request, µs: the unit every process's CPU per request is compared with. */
    cpuUs: median(runs.map(r => cpuUs(r, 'baseline'))),
    /** (max − min) / mean of the runs' requests a second. */
    spread: spread(runs),
  }
}
export type Baseline = ReturnType<typeof baselineOf>

export function spread(runs: LoadRun[]): number {
  const rps = runs.map(r => r.load.rps)
  return rps.length > 1 ? (Math.max(...rps) - Math.min(...rps)) / mean(rps) : 0
}

/** The run at the size its section shows, if it was measured. */
export const mainPoll = (r: Results) => r.polls.find(p => p.agents === r.sizes.agents)
export const mainStreams = (r: Results) => r.streams.find(s => s.asked === r.sizes.streams)
export const mainInvoices = (r: Results) => r.invoices.find(i => i.periods === r.sizes.periods)

/** CPU µs an invoice of the workers, Postgres and Redis together (the first run, its events relayed). */
export function invoiceCpuUs(run: InvoiceRun): number {
  const seconds = Object.values(run.cpuSeconds).reduce((a, b) => a + b, 0)
  return run.first.issued > 0 ? (seconds * 1e6) / run.first.issued : 0
}
