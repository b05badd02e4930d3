/** Pub/sub: one subscriber connection per process, fanned out to in-process handlers by channel. */
import { closeRedis, type Redis } from './redis.ts'

export type Handler = (message: string) => void

/** A subscription made on first use: a process that never uses it (a worker) receives nothing. */
export interface Listener {
  /** Resolves once listening; the first call subscribes, a failed one lets the next try again. */
  listen(): Promise<void>
  stop(): Promise<void>
}

export interface PubSub {
  /** Listens on a channel; resolves once Redis confirms, returns the function that stops listening. */
  subscribe(channel: string, handler: Handler): Promise<() => Promise<void>>
  /** The handler, subscribed on the first `listen()` rather than now. */
  listener(channel: string, handler: Handler): Listener
  /**
   * Hands `message` to this process's handlers of `channel` at once, as Redis will when it comes back:
   * for a change this process made and published, whose message may come back only after this
   * process has answered its next read from what the change made stale.
   */
  deliver(channel: string, message: string): void
  /** Called after the subscriber reconnects and listens again: messages may have been missed, caches must forget. */
  onReconnect(handler: () => void): void
  /**
   * Whether messages published now reach this process: false from the moment the subscriber's
   * connection drops until it listens again and the reconnect handlers have run. Meanwhile a cache
   * that pub/sub keeps honest must not be trusted.
   */
  listening(): boolean
  close(): Promise<void>
}

export function createPubSub(subscriber: Redis): PubSub {
  const handlers = new Map<string, Set<Handler>>()
  const reconnectHandlers: (() => void)[] = []
  // Usually connected before it gets here: then its next 'ready' is already a reconnect.
  let connectedOnce = subscriber.status === 'ready'
  let listening = connectedOnce

  const deliver = (channel: string, message: string) => {
    const set = handlers.get(channel)
    if (set) for (const handler of set) handler(message)
  }
  subscriber.on('message', deliver)
  subscriber.on('close', () => {
    listening = false
  })
  subscriber.on('ready', () => {
    if (connectedOnce) {
      // ioredis sends its SUBSCRIBEs again as it reconnects; a PING sent after them (on the next turn,
      // to be sure of it) answers once they are in force, so what a handler reads after it cannot
      // miss a message published meanwhile.
      setImmediate(() => {
        subscriber.ping().then(
          () => {
            for (const handler of reconnectHandlers) handler()
            listening = subscriber.status === 'ready'
          },
          () => {
            // Gone again: the next 'ready' runs the handlers. Still ready (Redis slow for a moment,
            // past the PING's timeout), nothing else would run them, and the process would take no
            // live message for good: connected again, it asks anew.
            if (subscriber.status === 'ready') subscriber.disconnect(true)
          },
        )
      })
    } else {
      listening = true
    }
    connectedOnce = true
  })

  const subscribe: PubSub['subscribe'] = async (channel, handler) => {
    let set = handlers.get(channel)
    if (!set) {
      set = new Set()
      handlers.set(channel, set)
      try {
        await subscriber.subscribe(channel)
      } catch (error) {
        // Not listening after all: the next subscribe must ask Redis again.
        if (handlers.get(channel) === set && set.size === 0) handlers.delete(channel)
        throw error
      }
    }
    set.add(handler)
    return async () => {
      const current = handlers.get(channel)
      if (!current) return
      current.delete(handler)
      if (current.size === 0) {
        handlers.delete(channel)
        // Not awaited: with Redis paused or cut off it would wait out the command's timeout, at every
        // stop of a shutdown. A SUBSCRIBE sent after it, on the same connection, still comes after it.
        subscriber.unsubscribe(channel).catch(() => {})
      }
    }
  }

  return {
    subscribe,
    deliver,
    listener(channel, handler) {
      let listening: Promise<() => Promise<void>> | undefined
      return {
        async listen() {
          listening ??= subscribe(channel, handler).catch(error => {
            listening = undefined
            throw error
          })
          await listening
        },
        async stop() {
          const stop = await listening?.catch(() => undefined)
          await stop?.()
        },
      }
    },
    onReconnect(handler) {
      reconnectHandlers.push(handler)
    },
    listening: () => listening,
    async close() {
      handlers.clear()
      await closeRedis(subscriber)
    },
  }
}
