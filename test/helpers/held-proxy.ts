/**
 * A TCP proxy on 127.0.0.1 in front of a real server (Redis, say) that can hold what clients send:
 * while held, their bytes wait in the proxy and nothing reaches the server, so a test can keep one
 * client's commands in flight at a chosen point without touching the server every test file shares;
 * or stop it, so that the server looks down (connections dropped, new ones refused) until restarted;
 * or stall the connections open, so that they go half-open while new ones work; or delay what passes,
 * so that the server looks far away (another zone, another region) or a path loses packets for a while,
 * without touching the loopback every test shares (as `tc netem` would).
 */
import { connect, createServer, type Socket } from 'node:net'

/** How far away the server looks: milliseconds each way, and up to `jitterMs` more, drawn per chunk. */
export interface Delay {
  /** Client to server. */
  toServer: number
  /** Server to client. */
  toClient: number
  /** Up to this much more per chunk, at random; a chunk never overtakes one sent before it on its way. */
  jitterMs?: number
}

/** Exchanges seen: a flight is a run of chunks one way after the other side last spoke on that connection. */
export interface Traffic {
  /** Flights from clients to the server: requests whose answer was awaited, or pipelined batches sent in one go. */
  toServer: number
  toClient: number
  connections: number
}

/**
 * Round trips of a quiet client through one or more proxies (PostgreSQL's and Redis's, say): a round
 * begins each time the client sends after an answer reached it, on any connection of any proxy that
 * shares the counter. Requests sent together (pipelined, or side by side on several connections)
 * make one round; one that waits for another's answer makes one more. So, with nothing else running,
 * the rounds of a request are the round trips its latency pays for; background traffic only adds.
 */
export interface Rounds {
  count: number
  lastWas: 'client' | 'server' | null
}

export function roundCounter(): Rounds {
  return { count: 0, lastWas: null }
}

export interface HeldProxy {
  url: string
  /** Clients' bytes wait here from now on. */
  hold(): void
  /** Sends on what waited, and everything after it. */
  release(): void
  /** How many chunks clients sent wait in the proxy now (each write a client made while held, as a rule). */
  heldChunks(): number
  /**
   * Every open connection stops for good, left open: nothing read or passed on either way, not even
   * a close (half-open, as behind a NAT that forgot the flow). New connections work.
   */
  stall(): void
  /**
   * Sends `bytes` to each open connection's client just before the server's next answer on it, as if
   * the server had sent them first (a message of its own: a ParameterStatus, say). Only between
   * answers: the next bytes from the server must begin a message.
   */
  inject(bytes: Buffer): void
  /** New connections go to `target` from now on (a name that now resolves to another server); open ones stay where they are. */
  retarget(target: string): void
  /**
   * Bytes passed on from now on, both ways, on every connection, wait as `delay` says (in order: TCP's
   * stream is kept); a close follows the bytes before it. `{toServer: 0, toClient: 0}`: as near as before.
   */
  delay(delay: Delay): void
  /**
   * One open connection passes nothing on, either way, for `ms` from now, then everything that waited
   * at once: a path losing every packet for a while and TCP retransmitting. Which one: the `index`-th
   * oldest open, or by default one chosen at random among those that carried bytes in the last second
   * (a connection in use). Returns how many connections it chose from (0: nothing was spiked).
   */
  spike(ms: number, index?: number): number
  /** Exchanges counted since the proxy started (or since the last `resetTraffic`). */
  traffic(): Traffic
  resetTraffic(): void
  /** Drops every connection and stops listening: the server looks down. */
  stop(): Promise<void>
  /** Listens again, on the same port. */
  restart(): Promise<void>
  close(): Promise<void>
}

/** One direction of one connection: chunks in order, each with the time it may go. */
interface Lane {
  to: Socket
  /** Called as bytes are written to `to`. */
  delivered?: () => void
  queue: { at: number; chunk: Buffer | string }[]
  /** When the last chunk queued may go: none goes before it (no overtaking). */
  lastAt: number
  timer?: ReturnType<typeof setTimeout>
  /** Destroy `to` once the queue is empty (the other side closed after these bytes). */
  closeAfter: boolean
}

export async function startHeldProxy(target: string, options: { rounds?: Rounds } = {}): Promise<HeldProxy> {
  const rounds = options.rounds ?? roundCounter()
  const { protocol } = new URL(target)
  let { hostname, port } = new URL(target)
  let held = false
  let delay: Delay = { toServer: 0, toClient: 0 }
  let traffic: Traffic = { toServer: 0, toClient: 0, connections: 0 }
  const waiting: { lane: Lane; chunk: Buffer | string }[] = []
  const sockets = new Set<Socket>()
  const stalled = new WeakSet<Socket>()
  const clients = new Set<Socket>()
  const injections = new Map<Socket, Buffer>()
  /** Open connections, oldest first: their lanes and when a spike lets them go. */
  const pairs: { client: Socket; lanes: [Lane, Lane]; blockedUntil: number; activeAt: number }[] = []

  const pump = (lane: Lane) => {
    clearTimeout(lane.timer)
    lane.timer = undefined
    // A stalled connection passes on nothing, what waited to be delayed included.
    if (stalled.has(lane.to)) return void lane.queue.splice(0)
    const now = performance.now()
    while (lane.queue.length > 0 && lane.queue[0]!.at <= now) {
      lane.to.write(lane.queue.shift()!.chunk)
      lane.delivered?.()
    }
    if (lane.queue.length > 0) lane.timer = setTimeout(pump, lane.queue[0]!.at - now, lane)
    else if (lane.closeAfter) lane.to.destroy()
  }
  const send = (lane: Lane, chunk: Buffer | string, oneWayMs: number, blockedUntil: number) => {
    const now = performance.now()
    const jitter = delay.jitterMs ? Math.random() * delay.jitterMs : 0
    const at = Math.max(now + oneWayMs + jitter, lane.lastAt, blockedUntil)
    lane.lastAt = at
    if (at <= now && lane.queue.length === 0) {
      lane.to.write(chunk)
      return lane.delivered?.()
    }
    lane.queue.push({ at, chunk })
    if (lane.queue.length === 1) pump(lane)
  }
  const closeWhenSent = (lane: Lane) => {
    lane.closeAfter = true
    if (lane.queue.length === 0) lane.to.destroy()
  }

  const server = createServer(client => {
    const upstream = connect(Number(port), hostname)
    clients.add(client)
    traffic.connections++
    const toServer: Lane = { to: upstream, queue: [], lastAt: 0, closeAfter: false }
    const toClient: Lane = { to: client, queue: [], lastAt: 0, closeAfter: false, delivered: () => void (rounds.lastWas = 'server') }
    const pair = { client, lanes: [toServer, toClient] as [Lane, Lane], blockedUntil: 0, activeAt: 0 }
    pairs.push(pair)
    let lastSpoke: 'client' | 'server' | null = null
    client.on('close', () => {
      clients.delete(client)
      injections.delete(client)
      pairs.splice(pairs.indexOf(pair), 1)
    })
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => socket.destroy())
    }
    client.on('data', chunk => {
      if (stalled.has(client)) return
      pair.activeAt = performance.now()
      if (lastSpoke !== 'client') traffic.toServer++
      lastSpoke = 'client'
      if (rounds.lastWas !== 'client') rounds.count++
      rounds.lastWas = 'client'
      if (held) waiting.push({ lane: toServer, chunk })
      else send(toServer, chunk, delay.toServer, pair.blockedUntil)
    })
    upstream.on('data', chunk => {
      if (stalled.has(upstream)) return
      if (lastSpoke !== 'server') traffic.toClient++
      lastSpoke = 'server'
      const injected = injections.get(client)
      if (injected) {
        injections.delete(client)
        send(toClient, injected, delay.toClient, pair.blockedUntil)
      }
      send(toClient, chunk, delay.toClient, pair.blockedUntil)
    })
    client.on('close', () => void (stalled.has(client) || closeWhenSent(toServer)))
    upstream.on('close', () => void (stalled.has(upstream) || closeWhenSent(toClient)))
  })
  const listen = (at: number) => new Promise<void>(resolve => server.listen(at, '127.0.0.1', resolve))
  const stop = async () => {
    // Refuse new connections first, then drop the open ones, which close() waits for.
    const closed = server.listening ? new Promise<void>(resolve => server.close(() => resolve())) : undefined
    for (const pair of pairs) for (const lane of pair.lanes) clearTimeout(lane.timer)
    for (const socket of sockets) socket.destroy()
    await closed
  }
  await listen(0)
  const address = server.address()
  if (!address || typeof address === 'string') throw new Error('the proxy has no port')
  return {
    url: `${protocol}//127.0.0.1:${address.port}`,
    hold: () => void (held = true),
    heldChunks: () => waiting.length,
    release() {
      held = false
      for (const { lane, chunk } of waiting.splice(0)) send(lane, chunk, delay.toServer, 0)
    },
    stall() {
      for (const socket of sockets) {
        stalled.add(socket)
        socket.pause()
      }
    },
    inject(bytes) {
      for (const client of clients) injections.set(client, bytes)
    },
    retarget(next) {
      ;({ hostname, port } = new URL(next))
    },
    delay(next) {
      delay = { ...next }
    },
    spike(ms, index) {
      const active = pairs.filter(pair => pair.activeAt > performance.now() - 1000)
      const among = index === undefined ? active : pairs
      const pair = index === undefined ? active[Math.floor(Math.random() * active.length)] : pairs[index]
      if (!pair) return 0
      pair.blockedUntil = performance.now() + ms
      // What already waits goes no earlier either.
      for (const lane of pair.lanes) {
        for (const queued of lane.queue) queued.at = Math.max(queued.at, pair.blockedUntil)
        lane.lastAt = Math.max(lane.lastAt, pair.blockedUntil)
        if (lane.queue.length > 0) pump(lane)
      }
      return among.length
    },
    traffic: () => ({ ...traffic }),
    resetTraffic() {
      traffic = { toServer: 0, toClient: 0, connections: 0 }
    },
    stop,
    restart: () => listen(address.port),
    close: stop,
  }
}
