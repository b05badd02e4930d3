/** Time as a dependency, so tests move through expiries and billing periods without sleeping. */

export interface Clock {
  now(): Date
}

export const systemClock: Clock = { now: () => new Date() }

/** A clock that runs with real time but can be moved forward (or set) by tests. */
export function adjustableClock(): Clock & { advance(ms: number): void; set(at: Date): void } {
  let offset = 0
  return {
    now: () => new Date(Date.now() + offset),
    advance: ms => {
      offset += ms
    },
    set: at => {
      offset = at.getTime() - Date.now()
    },
  }
}
