/** What the scenarios hand the report. */
import type { LoadResult } from './load.ts'

export interface Settings {
  connections: number
  /** Measured seconds of each load scenario, split into rounds. */
  seconds: number
  /** Turns of a load scenario, each after a baseline run. */
  rounds: number
  warmSeconds: number
}

export interface ProcessFigures {
  /** Peak RSS during the measurement, MB. */
  peakMb: number
  /** Average CPU use during the measurement, in cores. */
  cpu: number
}

export interface LoadRun {
  load: LoadResult
  processes: Record<string, ProcessFigures>
  /** The baseline runs (indexes) that bracket this one: its ratios are to their mean. */
  against?: number[]
}

export interface PollRun extends LoadRun {
  agents: number
  pendingAgents: number
  /** Agents whose warm-up poll showed their pending conversation. */
  pendingSeen: number
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
  first: { issued: number; seconds: number; processSeconds: number; counted: number }
  second: { issued: number; seconds: number }
  duplicates: number
  workersPeakMb: number
}
