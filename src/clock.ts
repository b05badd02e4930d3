/** Time as a dependency, so tests move through expiries and billing periods without sleeping. */

export interface Clock {
  now(): Date
}

export const systemClock: Clock = { now: () => new Date() }

export interface AdjustableClock extends Clock {
  advance(ms: number): void
  /** Jumps to `at` and runs on from there. */
  set(at: Date): void
  /** Stops at `at` until the next set, advance or resume. */
  freeze(at: Date): void
  resume(): void
}

/** A clock that runs with real time but can be moved, or stopped, by tests. */
export function adjustableClock(): AdjustableClock {
  let offset = 0
  let frozen: number | null = null
  return {
    now: () => new Date(frozen ?? Date.now() + offset),
    advance: ms => {
      if (frozen !== null) frozen += ms
      else offset += ms
    },
    set: at => {
      frozen = null
      offset = at.getTime() - Date.now()
    },
    freeze: at => {
      frozen = at.getTime()
    },
    resume: () => {
      if (frozen !== null) offset = frozen - Date.now()
      frozen = null
    },
  }
}
