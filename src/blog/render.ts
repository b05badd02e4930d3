/**
 * Posts' Markdown rendered off the event loop, with a time limit. marked needs seconds for some
 * inputs of the allowed size (tens of thousands of emphasis marks) and recurses past the stack on
 * thousands of nested quotes; such a post is refused as too complex instead of stalling the API.
 * One worker thread renders one post at a time; a render that runs over the limit is stopped by
 * ending the thread, and the next render starts a fresh one. A render that could not start within
 * `maxWaitMs` (others before it took their full time) is not run, so no request waits for long.
 */
import type { Db } from '../db.ts'
import type { Log } from '../log.ts'
import { escapeHtml } from './markdown.ts'
import { renderThreads } from './render-thread.ts'
import { storeContentHtml, type FeedPostRow, type PostWithHtml } from './store.ts'

export interface MarkdownRenderer {
  /**
   * The HTML of a post's Markdown, or null when it cannot be rendered within the limit, or renders to
   * more than `maxHtmlBytes` (too complex).
   * Rejects with `RendererBusy` when it could not start in time or too many wait, and with an error
   * when the thread failed for a reason of its own: neither says anything about the post.
   */
  render(source: string): Promise<string | null>
  close(): Promise<void>
}

/** The renderer was busy with others' posts: the caller should come back later. */
export class RendererBusy extends Error {
  override name = 'RendererBusy'
}

export interface RendererOptions {
  log: Log
  /** How long one render may take. */
  timeoutMs?: number
  /** How long a render may wait for its turn; past it, `render` rejects with `RendererBusy`. */
  maxWaitMs?: number
  /** Renders that may wait at once (their sources are held meanwhile); past it, `RendererBusy`. */
  maxWaiting?: number
  /** The thread's module (tests: one that cannot load). */
  workerUrl?: string
}

export function createMarkdownRenderer(options: RendererOptions): MarkdownRenderer {
  const { log } = options
  const timeoutMs = options.timeoutMs ?? 2000
  const maxWaitMs = options.maxWaitMs ?? 5000
  const maxWaiting = options.maxWaiting ?? 200
  const threads = renderThreads(options.workerUrl ?? new URL('./render-worker.ts', import.meta.url).href, log)
  let worker: Worker | undefined
  let queue: Promise<unknown> = Promise.resolve()
  /** Renders asked for and not yet finished, the running one included. */
  let pending = 0
  let closed = false

  const stop = (w: Worker) => {
    w.terminate()
    if (worker === w) worker = undefined
  }

  const renderNow = (source: string) =>
    new Promise<string | null>((resolve, reject) => {
      if (!worker) {
        worker = threads.start()
        if (!worker) return reject(new RendererBusy('the renderer cannot start a thread now'))
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
        reject(new Error(`the markdown renderer failed: ${event.message}`))
      }
      w.postMessage(source)
    })

  return {
    render(source) {
      if (closed) return Promise.reject(new Error('the markdown renderer is closed'))
      if (pending > maxWaiting) return Promise.reject(new RendererBusy('too many posts waiting to be rendered'))
      pending++
      const deadline = performance.now() + maxWaitMs
      const rendered = queue
        .then(() => {
          if (performance.now() > deadline) throw new RendererBusy('other posts took the renderer too long')
          return renderNow(source)
        })
        .finally(() => pending--)
      queue = rendered.catch(() => {})
      return rendered
    },
    async close() {
      closed = true
      await queue
      if (worker) stop(worker)
      threads.close()
    },
  }
}

/** A post with the HTML a page or feed shows. */
export type RenderedPost = PostWithHtml & { contentHtml: string }

/**
 * Posts with their HTML: as stored, or, for a post written before content was rendered at write
 * time, rendered now and stored (its Markdown shown as plain text if it is too complex to render).
 */
export async function withHtml(deps: { sql: Db; markdown: MarkdownRenderer }, posts: PostWithHtml[]): Promise<RenderedPost[]> {
  const out: RenderedPost[] = []
  for (const post of posts) {
    let html = post.contentHtml
    if (html === null) {
      const rendered = await deps.markdown.render(post.content).catch(() => undefined)
      const fallback = `<pre>${escapeHtml(post.content)}</pre>`
      // Kept only once known: rendered, or known too complex. A busy or failed renderer says
      // nothing about the post, so it is shown as text this time and rendered at a later view.
      if (rendered !== undefined) await storeContentHtml(deps.sql, post, rendered ?? fallback)
      html = rendered ?? fallback
    }
    out.push({ ...post, contentHtml: html })
  }
  return out
}

/** A feed's post: its HTML, null for one past the feed's budget (`listFeedPosts`). */
export type FeedPost = Omit<FeedPostRow, 'content'>

/** A feed's posts, a post within its budget kept before its HTML was rendered now as `withHtml` does. */
export async function feedWithHtml(deps: { sql: Db; markdown: MarkdownRenderer }, posts: FeedPostRow[]): Promise<FeedPost[]> {
  const out: FeedPost[] = []
  for (const { content, ...post } of posts) {
    if (post.contentHtml !== null || content === null) out.push(post)
    else out.push({ ...post, contentHtml: (await withHtml(deps, [{ ...post, content }]))[0]!.contentHtml })
  }
  return out
}
