/**
 * Gathering the work of the moment into batches: items queue under a key (an actor), each key's in
 * the order they came; a batch takes up to `maxKeys` keys with all their items, and a key in a running
 * batch waits for it to end before its next items go, so each key's items run one batch after
 * another, in order. At most `slots` batches hold a slot at once; a batch may give its slot back early
 * (`free`, once its transaction is done) and finish its work beside the next one.
 */
export interface BatcherOptions<T> {
  /** Runs one batch: the items by key, in order. Resolves when the keys may go on; settles every item itself (a rejection is dropped). */
  run(batch: Map<string, T[]>, free: () => void): Promise<void>
  /** Batches holding a slot at once. */
  slots: number
  /** Keys in one batch. */
  maxKeys: number
}

export interface Batcher<T> {
  add(key: string, item: T): void
  /** Takes out what waits and has not started. */
  clear(): Map<string, T[]>
  /** Resolves once nothing waits and nothing runs (what waits is still run). */
  drain(): Promise<void>
}

export function createBatcher<T>(options: BatcherOptions<T>): Batcher<T> {
  const { slots, maxKeys } = options
  const queued = new Map<string, T[]>()
  /** Keys of running batches. */
  const busy = new Set<string>()
  const running = new Set<Promise<void>>()
  /** Batches holding a slot. */
  const holding = new Set<object>()
  let scheduled = false

  const schedule = () => {
    if (scheduled) return
    scheduled = true
    setImmediate(flush)
  }

  const take = () => {
    const batch = new Map<string, T[]>()
    for (const [key, items] of queued) {
      if (busy.has(key)) continue
      queued.delete(key)
      busy.add(key)
      batch.set(key, items)
      if (batch.size >= maxKeys) break
    }
    return batch
  }

  const flush = () => {
    scheduled = false
    while (queued.size > 0 && holding.size < slots) {
      const batch = take()
      if (batch.size === 0) return
      const slot = {}
      holding.add(slot)
      const free = () => {
        if (holding.delete(slot) && queued.size > 0) schedule()
      }
      const run = options
        .run(batch, free)
        .catch(() => {})
        .finally(() => {
          free()
          for (const key of batch.keys()) busy.delete(key)
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
    clear() {
      const taken = new Map(queued)
      queued.clear()
      return taken
    },
    async drain() {
      while (queued.size > 0 || running.size > 0 || scheduled) {
        if (queued.size > 0) schedule()
        await Promise.allSettled([...running])
        await new Promise(resolve => setImmediate(resolve))
      }
    },
  }
}
