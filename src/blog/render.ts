/**
 * Posts' Markdown rendered off the event loop, with a time limit. marked needs seconds for some
 * inputs of the allowed size (tens of thousands of emphasis marks) and recurses past the stack on
 * thousands of nested quotes; such a post is refused as too complex instead of stalling the API.
 * One worker thread renders one post at a time; a render that runs over the limit is stopped by
 * ending the thread, and the next render starts a fresh one.
 */
import type { Db } from '../db.ts'
import type { Log } from '../log.ts'
import { escapeHtml } from './markdown.ts'
import { storeContentHtml, type FullPostRow } from './store.ts'

export interface MarkdownRenderer {
  /** The HTML of a post's Markdown, or null when it cannot be rendered within the limit. */
  render(source: string): Promise<string | null>
  close(): Promise<void>
}

export function createMarkdownRenderer(options: { log: Log; timeoutMs?: number }): MarkdownRenderer {
  const { log } = options
  const timeoutMs = options.timeoutMs ?? 2000
  let worker: Worker | undefined
  let queue: Promise<unknown> = Promise.resolve()
  let closed = false

  const stop = (w: Worker) => {
    w.terminate()
    if (worker === w) worker = undefined
  }

  const renderNow = (source: string) =>
    new Promise<string | null>(resolve => {
      if (!worker) {
        worker = new Worker(new URL('./render-worker.ts', import.meta.url).href)
        // An idle renderer keeps no process alive (a CLI, a test) past its own work.
        worker.unref()
      }
      const w = worker
      const timer = setTimeout(() => {
        log.warn('markdown render over its time limit; refused', { chars: source.length, timeoutMs })
        stop(w)
        resolve(null)
      }, timeoutMs)
      w.onmessage = (event: MessageEvent<string | null>) => {
        clearTimeout(timer)
        resolve(event.data)
      }
      w.onerror = event => {
        clearTimeout(timer)
        log.error('markdown renderer failed', { message: event.message })
        stop(w)
        resolve(null)
      }
      w.postMessage(source)
    })

  return {
    render(source) {
      if (closed) return Promise.reject(new Error('the markdown renderer is closed'))
      const rendered = queue.then(() => renderNow(source))
      queue = rendered.catch(() => {})
      return rendered
    },
    async close() {
      closed = true
      await queue
      if (worker) stop(worker)
    },
  }
}

/** A post with the HTML a page or feed shows. */
export type RenderedPost = FullPostRow & { contentHtml: string }

/**
 * Posts with their HTML: as stored, or, for a post written before content was rendered at write
 * time, rendered now and stored (its Markdown shown as plain text if it cannot be rendered in time).
 */
export async function withHtml(deps: { sql: Db; markdown: MarkdownRenderer }, posts: FullPostRow[]): Promise<RenderedPost[]> {
  const out: RenderedPost[] = []
  for (const post of posts) {
    let html = post.contentHtml
    if (html === null) {
      html = (await deps.markdown.render(post.content)) ?? `<pre>${escapeHtml(post.content)}</pre>`
      await storeContentHtml(deps.sql, post, html)
    }
    out.push({ ...post, contentHtml: html })
  }
  return out
}
