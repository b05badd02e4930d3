/** The bench's command line: which scenarios, how long, how many rounds, and the sizes of each scenario. */
import { parseArgs } from 'node:util'
import type { Settings } from './types.ts'

export const scenarios = ['baseline', 'poll', 'reply', 'streams', 'invoices'] as const

/** Sizes measured by default (a few minutes in all) and with --scale (the scaling tables). */
const defaultSizes = { poll: [1_000, 10_000], streams: [1_000, 5_000], periods: [10_000, 100_000] }
const fullSizes = { poll: [1_000, 10_000, 100_000], streams: [1_000, 5_000, 20_000], periods: [10_000, 100_000, 1_000_000] }

export interface Options {
  only: Set<string>
  /** Every scenario runs: the report is bench/RESULTS.md (else bench/.out/RESULTS.md). */
  complete: boolean
  profile?: 'poll' | 'reply'
  settings: Settings
  /** The size each scenario's own section shows. */
  sizes: { agents: number; streams: number; periods: number }
  /** Every size measured, ascending, the section's own among them. */
  pollSizes: number[]
  streamSizes: number[]
  periodSizes: number[]
  /** The API serves /metrics (behind a token), so every request is timed: to measure what that costs. */
  metrics: boolean
}

function count(name: string, value: string): number {
  const n = Number(value.replace(/_/g, ''))
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} takes a whole number (got ${value})`)
  return n
}

function list(name: string, value: string | undefined, fallback: number[], main: number): number[] {
  const sizes = value ? value.split(',').map(v => count(name, v)) : fallback
  return [...new Set([...sizes, main])].sort((a, b) => a - b)
}

export function parseOptions(args: string[]): Options {
  const { values } = parseArgs({
    args,
    options: {
      only: { type: 'string' },
      profile: { type: 'string' },
      seconds: { type: 'string', default: '12' },
      rounds: { type: 'string', default: '3' },
      warm: { type: 'string', default: '3' },
      connections: { type: 'string', default: '64' },
      threads: { type: 'string', default: '1' },
      agents: { type: 'string', default: '10000' },
      streams: { type: 'string', default: '5000' },
      periods: { type: 'string', default: '100000' },
      scale: { type: 'boolean', default: false },
      metrics: { type: 'boolean', default: false },
      'poll-sizes': { type: 'string' },
      'stream-sizes': { type: 'string' },
      'period-sizes': { type: 'string' },
    },
  })
  const profile = values.profile as Options['profile']
  if (profile && profile !== 'poll' && profile !== 'reply') throw new Error('--profile takes poll or reply')
  const only = new Set<string>(profile ? [profile] : values.only ? values.only.split(',') : scenarios)
  for (const name of only) if (!(scenarios as readonly string[]).includes(name)) throw new Error(`--only takes ${scenarios.join(', ')} (got ${name})`)
  const sizes = { agents: count('agents', values.agents), streams: count('streams', values.streams), periods: count('periods', values.periods) }
  const pick = values.scale ? fullSizes : defaultSizes
  const settings: Settings = {
    connections: count('connections', values.connections),
    threads: count('threads', values.threads),
    seconds: count('seconds', values.seconds),
    rounds: count('rounds', values.rounds),
    warmSeconds: count('warm', values.warm),
  }
  // wrk's --duration is in whole seconds.
  const perRound = settings.seconds / settings.rounds
  if (!Number.isInteger(perRound)) throw new Error(`--seconds (${settings.seconds}) must split into --rounds (${settings.rounds}) of whole seconds`)
  return {
    metrics: values.metrics,
    only,
    complete: scenarios.every(name => only.has(name)),
    profile,
    settings,
    sizes,
    // A profile is of the section's own size only.
    pollSizes: profile ? [sizes.agents] : list('poll-sizes', values['poll-sizes'], pick.poll, sizes.agents),
    streamSizes: list('stream-sizes', values['stream-sizes'], pick.streams, sizes.streams),
    periodSizes: list('period-sizes', values['period-sizes'], pick.periods, sizes.periods),
  }
}
