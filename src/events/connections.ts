/** The process's open event streams: by stream, by the API key each was opened with, and ended once. */
import type { Redis } from '../redis.ts'
import { streamLength, type Published } from './relay.ts'

// A client this many chunks behind is cut off; it comes back with its last id and catches up by replay.
// A whole replay (the last `streamLength` events, queued at once before the client reads any) and its
// retry line fit, with room for what comes meanwhile: a client resuming from far back is not cut off
// every time it comes back.
const maxQueued = streamLength + 100

export interface Connection {
  id: string
  stream: string
  controller: ReadableStreamDefaultController<Uint8Array>
  /** Events that arrived while a catch-up (a resume's replay, or after a drop of the subscription) was being read. */
  buffer: Published[] | null
  /** The last event sent, or the stream's newest at opening: what a catch-up reads after. */
  lastId: string
  limitKey: string | null
  /** The hex hash of the API key the stream was opened with, if one. */
  keyHash: string | null
  closed: boolean
}

export type Connections = ReturnType<typeof createConnections>

export function createConnections(redis: Redis) {
  const byStream = new Map<string, Set<Connection>>()
  const byKey = new Map<string, Set<Connection>>()
  const all = new Set<Connection>()

  const addTo = (map: Map<string, Set<Connection>>, key: string, connection: Connection) => {
    const set = map.get(key) ?? new Set<Connection>()
    set.add(connection)
    map.set(key, set)
  }
  const removeFrom = (map: Map<string, Set<Connection>>, key: string, connection: Connection) => {
    const set = map.get(key)
    set?.delete(connection)
    if (set?.size === 0) map.delete(key)
  }

  /** Ends a stream: gracefully (what is queued is still sent), or at once, dropping the backlog. */
  const end = (connection: Connection, abort = false) => {
    if (connection.closed) return
    connection.closed = true
    all.delete(connection)
    removeFrom(byStream, connection.stream, connection)
    if (connection.keyHash) removeFrom(byKey, connection.keyHash, connection)
    try {
      if (abort) connection.controller.error()
      else connection.controller.close()
    } catch {
      // already closed by the client
    }
    if (connection.limitKey) redis.zrem(connection.limitKey, connection.id).catch(() => {})
  }

  return {
    get size() {
      return all.size
    },
    /** Every open stream, as a list (ending one while going through it is safe). */
    all: () => [...all],
    add(connection: Connection) {
      all.add(connection)
      addTo(byStream, connection.stream, connection)
      if (connection.keyHash) addTo(byKey, connection.keyHash, connection)
    },
    ofStream: (stream: string): ReadonlySet<Connection> | undefined => byStream.get(stream),
    /** The streams opened with this API key. */
    ofKey: (keyHash: string) => [...(byKey.get(keyHash) ?? [])],
    /** The API keys streams were opened with. */
    keyHashes: () => [...byKey.keys()],
    end,
    /** Queues a chunk; a client too far behind is cut off. */
    send(connection: Connection, chunk: Uint8Array) {
      if (connection.closed) return
      if ((connection.controller.desiredSize ?? 0) < -maxQueued) return end(connection, true)
      try {
        connection.controller.enqueue(chunk)
      } catch {
        end(connection)
      }
    },
  }
}
