/** The process's budget of upstream bytes its proxy calls may hold buffered at once, so their answers cannot exhaust its memory. */
import { errors } from '../errors.ts'

export interface BufferBudget {
  /** Bytes reserved now, over every call in progress. */
  readonly reserved: number
  /**
   * Reserves `bytes` or throws 503 `unavailable` with Retry-After when they would take the process past
   * its budget; returns the release, which gives them back once (later calls do nothing).
   */
  reserve(bytes: number): () => void
}

/**
 * @example
 * const release = budget.reserve(maxResponseBytes)
 * try { await forward(request) } finally { release() }
 */
export function createBufferBudget(limitBytes: number): BufferBudget {
  let reserved = 0
  return {
    get reserved() {
      return reserved
    },
    reserve(bytes) {
      // Calls take seconds at most (the upstream's 10 s limit): a second is a fair time to come back.
      if (reserved + bytes > limitBytes) throw errors.unavailable('This server is holding as many upstream answers as it may; try again shortly', 1)
      reserved += bytes
      let held = true
      return () => {
        if (held) reserved -= bytes
        held = false
      }
    },
  }
}
