/**
 * Starting the Markdown renderer's thread when the process may be out of file descriptors. Bun 1.4.5
 * ends the whole process (exit 1, "bun ran out of file descriptors") when a Worker's thread cannot
 * open the descriptors of its event loop, and a flood of idle connections keeps the table full: the
 * listener takes each descriptor freed at once (docs/limits.md). So a few are held for the thread,
 * closed just before it starts, the event loop blocked (nothing accepted) until the thread has loaded
 * its module, then held again.
 */
import { closeSync, openSync } from 'node:fs'
import type { Log } from '../log.ts'

/** Descriptors held back: a thread opens 2 for its loop and a few more, briefly, to load its modules. */
const reserveSize = 16
/** The longest the event loop is blocked for a thread's start (about 20 ms on an idle machine). */
const startWaitMs = 2000
/**
 * After a thread that did not load within that wait, how long no thread is started while it still has
 * not loaded: a module that cannot load (a broken deploy) would otherwise block the loop the whole wait
 * at every start. One that loaded late (a machine busy for a moment) refuses nothing.
 */
const refuseMs = 60_000

export interface RenderThreads {
  /** A new thread; undefined when the descriptors it needs could not be set aside, or a thread lately started has not loaded. */
  start(): Worker | undefined
  close(): void
}

export function renderThreads(url: string, log: Log): RenderThreads {
  const held: number[] = []
  /** The last thread that did not load within the wait: its flag (set once it loads) and until when it refuses. */
  let late: { loaded: Int32Array; until: number } | undefined
  const fill = () => {
    try {
      while (held.length < reserveSize) held.push(openSync('/dev/null', 'r'))
    } catch {
      // Out of descriptors: the reserve stays short until some are freed.
    }
  }
  fill()
  return {
    start() {
      if (late && performance.now() < late.until && Atomics.load(late.loaded, 0) === 0) return undefined
      fill()
      if (held.length < reserveSize) return undefined
      for (const fd of held.splice(0)) closeSync(fd)
      // render-worker.ts sets it once loaded; Atomics.wait keeps the listener from taking the reserve meanwhile.
      const loaded = new SharedArrayBuffer(4)
      const worker = new Worker(url, { workerData: loaded } as WorkerOptions)
      const flag = new Int32Array(loaded)
      if (Atomics.wait(flag, 0, 0, startWaitMs) === 'timed-out') {
        late = { loaded: flag, until: performance.now() + refuseMs }
        log.error('markdown renderer thread did not load in time; none is started for a while', { waitedMs: startWaitMs, refuseMs })
      }
      fill()
      return worker
    },
    close() {
      for (const fd of held.splice(0)) closeSync(fd)
    },
  }
}
