/** Client-side timings of the well-behaved agents' requests, by kind, read back for a window of time. */
import { summarize } from './stats.ts'

export type RequestKind = 'poll' | 'reply' | 'respond' | 'message'
export const requestKinds: RequestKind[] = ['poll', 'reply', 'respond', 'message']

/** Wall-clock milliseconds comparable across processes (the attacker runs in its own). */
export const wallClock = () => performance.timeOrigin + performance.now()

export interface KindFigures {
  requests: number
  p50: number
  p99: number
  max: number
  /** Failures by status (or `network`): anything but 2xx. */
  errors: Record<string, number>
}

export interface Recorder {
  /** A request begun at `startedAt` (wallClock) that took `ms`; `failure` is its status, or `network`, when not 2xx. */
  record(kind: RequestKind, startedAt: number, ms: number, failure: string | null): void
  /** The requests begun within [from, to). */
  window(from: number, to: number): Record<RequestKind, KindFigures>
}

interface Sample {
  startedAt: number
  ms: number
  failure: string | null
}

export function createRecorder(): Recorder {
  const samples: Record<RequestKind, Sample[]> = { poll: [], reply: [], respond: [], message: [] }
  return {
    record(kind, startedAt, ms, failure) {
      samples[kind].push({ startedAt, ms, failure })
    },
    window(from, to) {
      const figures = {} as Record<RequestKind, KindFigures>
      for (const kind of requestKinds) {
        const within = samples[kind].filter(s => s.startedAt >= from && s.startedAt < to)
        const errors: Record<string, number> = {}
        for (const s of within) if (s.failure) errors[s.failure] = (errors[s.failure] ?? 0) + 1
        figures[kind] = { requests: within.length, ...summarize(within.map(s => s.ms)), errors }
      }
      return figures
    },
  }
}
