/** The Markdown renderer's thread (render.ts): renders each post it is sent and sends the HTML back. */
import { workerData } from 'node:worker_threads'
import { renderMarkdown } from './markdown.ts'

declare const self: Worker

// Loaded: the thread that started this one waits for it (render-thread.ts).
const loaded = new Int32Array(workerData as SharedArrayBuffer)
Atomics.store(loaded, 0, 1)
Atomics.notify(loaded, 0)

self.onmessage = (event: MessageEvent<string>) => {
  let html: string | null
  try {
    // null too when its HTML would pass maxHtmlBytes (a long link reference used thousands of times)
    html = renderMarkdown(event.data)
  } catch {
    // marked recursing past the stack on thousands of nested quotes or lists: not renderable.
    html = null
  }
  postMessage(html)
}
