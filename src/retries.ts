/**
 * Work that must land eventually, tried in the background until it does: Redis state made good after
 * a write that Redis refused (a reply's inbox removal, an actor's projection given up). Each piece of
 * work has a key; work added under a key already waiting is merged with what waits, so a key is tried
 * once however often it was asked for. Attempts back off while they fail.
 */
export interface Retries<V> {
  /** Tries `value` until it lands; false after `close()`, when nothing will try it. */
  add(key: string, value: V): boolean
  /** Tries once more what has not landed; returns what is left, by key. */
  close(): Promise<Map<string, V>>
}

export interface RetriesOptions<V> {
  /** Makes the work land; throws while it cannot. */
  attempt(value: V, key: string): Promise<void>
  /** What waits when `added` is added under a key where `held` waits (default: `added`). */
  merge?(held: V, added: V): V
  /** Told of each failed attempt. */
  failed?(key: string, value: V, error: unknown): void
  /** Before the first attempt (default 0: at once). */
  initialDelayMs?: number
  /**
   * Between a failed attempt and the next: twice the delay before the failed one, at least this,
   * at most `maxDelayMs`. Back to `initialDelayMs` once nothing is left.
   */
  firstDelayMs?: number
  maxDelayMs?: number
}

export function createRetries<V>(options: RetriesOptions<V>): Retries<V> {
  const initialDelayMs = options.initialDelayMs ?? 0
  const firstDelayMs = options.firstDelayMs ?? 200
  const maxDelayMs = options.maxDelayMs ?? 5000
  const due = new Map<string, V>()
  let timer: ReturnType<typeof setTimeout> | undefined
  let running: Promise<void> | undefined
  let delay = initialDelayMs
  let closed = false
  let closing: Promise<Map<string, V>> | undefined

  const attempt = async () => {
    // Each key's value read when its turn comes: what was added meanwhile is tried in this round.
    for (const key of [...due.keys()]) {
      const value = due.get(key)
      if (value === undefined) continue
      try {
        await options.attempt(value, key)
        // Added to while it was tried: what was added stays, to be tried in turn.
        if (due.get(key) === value) due.delete(key)
      } catch (error) {
        try {
          options.failed?.(key, value, error)
        } catch {
          // Telling of a failure must not end the retries (nor, as an unhandled rejection, the process).
        }
      }
    }
  }

  const schedule = () => {
    if (closed || timer || running || due.size === 0) return
    timer = setTimeout(() => {
      timer = undefined
      running = attempt().finally(() => {
        running = undefined
        delay = due.size === 0 ? initialDelayMs : Math.min(Math.max(delay * 2, firstDelayMs), maxDelayMs)
        schedule()
      })
    }, delay)
    // Retrying in the background keeps no process alive; close() makes the last attempt.
    timer.unref?.()
  }

  return {
    add(key, value) {
      if (closed) return false
      const held = due.get(key)
      due.set(key, held === undefined || !options.merge ? value : options.merge(held, value))
      schedule()
      return true
    },
    close() {
      // Once: a second call waits for the first's last attempt instead of making its own beside it.
      closing ??= (async () => {
        closed = true
        clearTimeout(timer)
        timer = undefined
        await running
        if (due.size > 0) await attempt()
        return new Map(due)
      })()
      return closing
    },
  }
}
