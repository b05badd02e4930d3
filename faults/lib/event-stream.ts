/**
 * A user's notification stream (/v1/events/stream) held like a careful client holds it: when the
 * stream is cut, refused or silent past its pings, it reconnects (to the next API process) with
 * Last-Event-ID set to the last event it got. Every event received is kept.
 */

export interface ReceivedEvent {
  id: string
  type: string
  data: any
  receivedAt: number
  /** Which connection (index in `connections`) it came on. */
  connection: number
}

export interface StreamConnection {
  api: number
  openedAt: number
  /** The Last-Event-ID it was opened with. */
  resumedFrom: string
  status?: number
  error?: string
  endedAt?: number
}

export interface EventStream {
  name: string
  events: ReceivedEvent[]
  connections: StreamConnection[]
  /** Resolves once a connection answered 200 and sent its first line. */
  connected(ms?: number): Promise<void>
  close(): void
}

// Pings come every 5 s at least; a stream silent for longer than this is taken for dead.
const silentMs = 12_000
// After a cut the client comes back at once; after refusals it waits longer each time, up to 1 s.
const reconnectDelayMs = 100
const maxReconnectDelayMs = 1000

export function openEventStream(name: string, apiUrls: string[], token: string, firstApi: number): EventStream {
  const events: ReceivedEvent[] = []
  const connections: StreamConnection[] = []
  // "0-0" replays everything the stream keeps, so even a client cut before its first event misses nothing.
  let lastId = '0-0'
  let closed = false
  let isConnected = false
  let current: AbortController | undefined

  const readOne = async (api: number) => {
    const index = connections.length
    const connection: StreamConnection = { api, openedAt: Date.now(), resumedFrom: lastId }
    connections.push(connection)
    const abort = new AbortController()
    current = abort
    let lastData = Date.now()
    const watchdog = setInterval(() => {
      if (Date.now() - lastData > silentMs) abort.abort(new Error(`silent for ${silentMs} ms`))
    }, 1000)
    try {
      const response = await fetch(`${apiUrls[api]}/v1/events/stream`, {
        headers: { authorization: `Bearer ${token}`, 'last-event-id': lastId },
        signal: abort.signal,
      })
      connection.status = response.status
      if (response.status !== 200 || !response.body) {
        connection.error = (await response.text()).slice(0, 200)
        return
      }
      const decoder = new TextDecoder()
      let buffer = ''
      for await (const chunk of response.body) {
        lastData = Date.now()
        isConnected = true
        buffer += decoder.decode(chunk, { stream: true })
        let end: number
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const frame = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          const fields: Record<string, string> = {}
          for (const line of frame.split('\n')) {
            if (line.startsWith(':')) continue
            const colon = line.indexOf(':')
            if (colon < 0) continue
            fields[line.slice(0, colon)] = line.slice(colon + 1).replace(/^ /, '')
          }
          if (fields.id === undefined || fields.data === undefined) continue
          lastId = fields.id
          events.push({ id: fields.id, type: fields.event ?? 'message', data: JSON.parse(fields.data), receivedAt: Date.now(), connection: index })
        }
      }
      connection.error = 'ended by the server'
    } catch (error) {
      connection.error = closed ? 'closed by the client' : `${(error as Error).name}: ${(error as Error).message}`
    } finally {
      clearInterval(watchdog)
      connection.endedAt = Date.now()
    }
  }

  void (async () => {
    let api = firstApi
    let refusals = 0
    while (!closed) {
      await readOne(api)
      refusals = connections.at(-1)?.status === 200 ? 0 : refusals + 1
      api = (api + 1) % apiUrls.length
      if (!closed) await Bun.sleep(Math.min(maxReconnectDelayMs, reconnectDelayMs * 2 ** refusals))
    }
  })()

  return {
    name,
    events,
    connections,
    async connected(ms = 10_000) {
      const deadline = Date.now() + ms
      while (!isConnected) {
        if (Date.now() > deadline) throw new Error(`stream ${name} not connected within ${ms} ms: ${JSON.stringify(connections.slice(-3))}`)
        await Bun.sleep(20)
      }
    },
    close() {
      closed = true
      current?.abort()
    },
  }
}
