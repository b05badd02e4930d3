/**
 * Gathering the work of the moment into batches: items queue under a key (an actor, a conversation),
 * each key's in the order they came; a batch takes up to `maxKeys` keys, and a key in a running batch
 * waits for it to end before its next items go, so each key's items run one batch after another, in
 * order. At most `slots` batches hold a slot at once; a batch may give its slot back early (`free`,
 * once its statement is done) and finish its work beside the next one.
 */
export interface BatcherOptions<T> {
  /**
   * Runs one batch: the items by key, in order. Resolves when the keys may go on (`done` lets one
   * go on sooner); settles every item itself (a rejection is dropped).
   */
  run(batch: Map<string, T[]>, free: () => void, done: (key: string) => void): Promise<void>
  /** Batches holding a slot at once. */
  slots: number
  /** Keys in one batch. */
  maxKeys: number
  /** Items of one key in one batch (default: all that wait). */
  perKey?: number
  /**
   * With this set, a second slot is taken only once the batch in the first has run this long (a
   * stalled statement): one batch at a time carries the most work for the least cost.
   */
  stalledMs?: number
}

export interface Batcher<T> {
  add(key: string, item: T): void
  /** Resolves once nothing waits and nothing runs (what waits is still run). */
  drain(): Promise<void>
}

export function createBatcher<T>(options: BatcherOptions<T>): Batcher<T> {
  const { slots, maxKeys } = options
  const perKey = options.perKey ?? Infinity
  const queued = new Map<string, T[]>()
  /** Keys of running batches. */
  const busy = new Set<string>()
  const running = new Set<Promise<void>>()
  /** Batches holding a slot, with when each started. */
  const holding = new Map<object, number>()
  let scheduled = false
  let recheck: ReturnType<typeof setTimeout> | undefined

  const schedule = () => {
    if (scheduled) return
    scheduled = true
    setImmediate(flush)
  }

  const mayStart = () => {
    if (holding.size >= slots) return false
    if (!options.stalledMs || holding.size === 0) return true
    const since = performance.now() - Math.min(...holding.values())
    if (since >= options.stalledMs) return true
    recheck ??= setTimeout(() => {
      recheck = undefined
      schedule()
    }, options.stalledMs - since)
    return false
  }

  const take = () => {
    const batch = new Map<string, T[]>()
    for (const [key, items] of queued) {
      if (busy.has(key)) continue
      const taken = items.length <= perKey ? items : items.splice(0, perKey)
      if (taken === items) queued.delete(key)
      busy.add(key)
      batch.set(key, taken)
      if (batch.size >= maxKeys) break
    }
    return batch
  }

  const flush = () => {
    scheduled = false
    while (queued.size > 0 && mayStart()) {
      const batch = take()
      if (batch.size === 0) return
      const slot = {}
      holding.set(slot, performance.now())
      const free = () => {
        if (holding.delete(slot) && queued.size > 0) schedule()
      }
      const held = new Set(batch.keys())
      const done = (key: string) => {
        if (held.delete(key)) busy.delete(key)
        if (queued.has(key)) schedule()
      }
      const run = options
        .run(batch, free, done)
        .catch(() => {})
        .finally(() => {
          free()
          for (const key of held) busy.delete(key)
          running.delete(run)
          if (queued.size > 0) schedule()
        })
      running.add(run)
    }
  }

  return {
    add(key, item) {
      const items = queued.get(key)
      if (items) items.push(item)
      else queued.set(key, [item])
      schedule()
    },
    async drain() {
      while (queued.size > 0 || running.size > 0 || scheduled) {
        if (queued.size > 0) schedule()
        await Promise.allSettled([...running])
        await new Promise(resolve => setImmediate(resolve))
      }
      clearTimeout(recheck)
    },
  }
}
