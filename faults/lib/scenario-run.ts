/** What one scenario's run leaves for the checks: the deployment, the load's record, the streams, and the fault's times. */
import type { Deployment } from './deployment.ts'
import type { EventStream } from './event-stream.ts'
import type { Client } from './http-client.ts'
import type { Load } from './load-driver.ts'
import type { Pair } from './population.ts'
import type { PostgresServer } from '../../test/helpers/postgres-server.ts'
import type { RedisServer } from '../../test/helpers/redis-server.ts'

/** When the fault began, and when what was restarted accepted connections again. */
export interface FaultTimes {
  /** e.g. "Redis restarted keeping its data". */
  label: string
  /** What came back: "Redis", "PostgreSQL", "workers process", "api-1". */
  restarted: string
  downAt: number
  upAt: number
  /** What `upAt` is the moment of: "accepted connections" (a server), "logged that it started" (workers). */
  upMeans: string
  /** For an API process restarted: its index among the API URLs (its writes are the ones measured). */
  api?: number
}

export interface ScenarioRun {
  name: string
  servers: { postgres: PostgresServer; redis: RedisServer }
  deployment: Deployment
  client: Client
  pairs: Pair[]
  load: Load
  /** By user id: the owner's stream (conversation.message) and the subscriber's (conversation.reply). */
  streams: Map<string, EventStream>
  fault: FaultTimes
  /** Bodies the fake upstream received, in order. */
  upstreamBodies: () => string[]
  /** When the three job schedulers were all back in Redis after the fault, if they were within the watch. */
  schedulersBackAt?: number
  /** The last scheduler state seen, for a failure's explanation. */
  schedulersSeen: string
}

/** Milliseconds since the load started, as reports show times. */
export function at(run: ScenarioRun, time: number): string {
  return `+${time - run.load.startedAt} ms`
}

/** Where a time falls against the fault: before it, during it (down to up), or after. */
export function phase(run: ScenarioRun, time: number): string {
  if (time < run.fault.downAt) return 'before the fault'
  if (time <= run.fault.upAt) return 'during the fault'
  return `${time - run.fault.upAt} ms after ${run.fault.restarted} was back`
}

/** "Redis accepted connections": the moment recovery is measured from. */
export function backMoment(run: ScenarioRun): string {
  return `${run.fault.restarted} ${run.fault.upMeans}`
}
