/** Where the process is in its life: from the first shutdown signal on it is draining, and not ready. */

export interface Lifecycle {
  readonly draining: boolean
  /** Called once shutdown begins: readiness fails from then on, while open work finishes. */
  drain(): void
}

export function createLifecycle(): Lifecycle {
  let draining = false
  return {
    get draining() {
      return draining
    },
    drain() {
      draining = true
    },
  }
}
