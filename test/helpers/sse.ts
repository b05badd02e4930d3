/** SSE clients for tests: the `eventsource` package against a real listening server, collecting events. */
import { EventSource } from 'eventsource'
import type { App } from '../../src/app.ts'

export interface Received {
  id: string
  type: string
  data: any
}

export interface Listener {
  events: Received[]
  /**
   * Resolves once the stream first opened: the server answers only once it has fixed where the stream
   * starts, so every event appended after this reaches it.
   */
  opened: Promise<void>
  /** Resolves once `count` events (of the given types, if any) have arrived. */
  waitFor(count: number, types?: string[], ms?: number): Promise<Received[]>
  close(): void
}

const types = [
  'subscription.created',
  'subscription.cancelled',
  'review.created',
  'review.updated',
  'config.purchased',
  'conversation.message',
  'conversation.reply',
  'service.requested',
  'service.completed',
  'service.failed',
  'invoice.issued',
  'usage.threshold',
  'blog.published',
  'context.updated',
  'chat.message',
]

/** Listens on a real port; returns its base URL and a stopper. */
export function serve(app: App): { url: string; stop(): Promise<void> } {
  const server = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: request => app.handle(request), idleTimeout: 30 })
  return { url: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) }
}

export function listen(url: string, options: { token?: string; lastEventId?: string } = {}): Listener {
  const events: Received[] = []
  const waiters: (() => void)[] = []
  const source = new EventSource(url, {
    fetch: (input, init) => {
      const headers = new Headers(init?.headers)
      if (options.token) headers.set('authorization', `Bearer ${options.token}`)
      // The first request's place; a reconnect sends the id of the last event it got (set by EventSource).
      if (options.lastEventId && !headers.has('last-event-id')) headers.set('last-event-id', options.lastEventId)
      return fetch(input, { ...init, headers })
    },
  })
  const opened = new Promise<void>(resolve => source.addEventListener('open', () => resolve(), { once: true }))
  for (const type of types) {
    source.addEventListener(type, event => {
      events.push({ id: event.lastEventId, type: event.type, data: JSON.parse(event.data) })
      for (const wake of waiters.splice(0)) wake()
    })
  }
  return {
    events,
    opened,
    async waitFor(count, only, ms = 5000) {
      const deadline = Date.now() + ms
      const matching = () => (only ? events.filter(e => only.includes(e.type)) : events)
      while (matching().length < count) {
        if (Date.now() > deadline) throw new Error(`expected ${count} events, got ${JSON.stringify(events.map(e => e.type))}`)
        await new Promise<void>(resolve => {
          waiters.push(resolve)
          setTimeout(resolve, 50)
        })
      }
      return matching()
    },
    close: () => source.close(),
  }
}
