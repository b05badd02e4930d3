/** What the scenarios hand the report. */
import type { LoadResult } from './load.ts'

export interface Settings {
  connections: number
  /** wrk's threads (1: one core's worth of generator). */
  threads: number
  /** Measured seconds of each load scenario, split into rounds. */
  seconds: number
  /** Turns of a load scenario, each after a baseline run. */
  rounds: number
  warmSeconds: number
}

/** The processes whose CPU every load run measures, beside the server under load ("api" or "baseline"). */
export const backgroundRoles = ['workers', 'postgres', 'redis'] as const

export interface LoadRun {
  load: LoadResult
  /** The process under load: "api" or "baseline". */
  server: string
  /** CPU seconds each process used while measured: the server, workers, postgres (the run's backends), redis (the whole server). */
  cpuSeconds: Record<string, number>
  /** Seconds the measurement took (wrk's start-up included). */
  wallSeconds: number
  /** Redis commands (every client's) and the run's Postgres transactions while measured. */
  counts: { redisCommands: number; pgTransactions: number }
  /** Peak RSS (MB) of the service's processes watched. */
  peakMb: Record<string, number>
  /** The machine's 1-minute load average before and after. */
  loadavg: [number, number]
  /** A merged run's rounds, in order. */
  rounds?: LoadRun[]
  /** The baseline runs (indexes) that bracket this one: its ratios are to their mean. */
  against?: number[]
}

export interface PollRun extends LoadRun {
  agents: number
  pendingAgents: number
  /** Agents whose warm-up poll showed their pending conversation. */
  pendingSeen: number
  /** API RSS (MB) of the fresh process before the warm-up and after the measured rounds. */
  rssBeforeMb: number
  rssAfterMb: number
}

export interface ReplyRun extends LoadRun {
  agents: number
  /** Agent messages recorded in Postgres during the measurement. */
  recorded: number
  /** What one reply costs: CPU (µs) of each process, Redis commands (every client's), Postgres transactions. */
  perReply: { apiUs: number; workersUs: number; postgresUs: number; redisUs: number; redisCommands: number; pgTransactions: number }
  /** Of replies to waiting conversations (3b): how many of them were taken, warm-up included. */
  answered?: number
}

export interface StreamsRun {
  /** The count asked for; `streams` is fewer when the open-file limit could not hold them. */
  asked: number
  /** The open-file limit of each process when they were opened. */
  openFilesLimit: number
  streams: number
  opened: number
  openSeconds: number
  rssIdleMb: number
  rssOpenMb: number
  peakMb: number
  messages: { delivered: number; missing: number; p50: number; p99: number; max: number }[]
  all: { delivered: number; missing: number; p50: number; p99: number; max: number }
}

export interface InvoiceRun {
  periods: number
  seedSeconds: number
  /** `finished` false: the bench stopped waiting, and `issued` is what the run had issued by then. */
  first: { issued: number; seconds: number; processSeconds: number; counted: number; finished: boolean }
  /** The run that must issue nothing; absent when the first did not finish. */
  second?: { issued: number; seconds: number }
  duplicates: number
  workersPeakMb: number
  /** The first run's CPU seconds by process (workers, postgres, redis), until its events left the outbox. */
  cpuSeconds: Record<string, number>
  /** Seconds from the first run's end until the outbox was empty (its `invoice.issued` events relayed). */
  relaySeconds?: number
}
