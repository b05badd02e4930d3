/**
 * A TCP proxy on 127.0.0.1 in front of a real server (Redis, say) that can hold what clients send:
 * while held, their bytes wait in the proxy and nothing reaches the server, so a test can keep one
 * client's commands in flight at a chosen point without touching the server every test file shares;
 * or stop it, so that the server looks down (connections dropped, new ones refused) until restarted;
 * or stall the connections open, so that they go half-open while new ones work.
 */
import { connect, createServer, type Socket } from 'node:net'

export interface HeldProxy {
  url: string
  /** Clients' bytes wait here from now on. */
  hold(): void
  /** Sends on what waited, and everything after it. */
  release(): void
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
  /** Drops every connection and stops listening: the server looks down. */
  stop(): Promise<void>
  /** Listens again, on the same port. */
  restart(): Promise<void>
  close(): Promise<void>
}

export async function startHeldProxy(target: string): Promise<HeldProxy> {
  const { protocol } = new URL(target)
  let { hostname, port } = new URL(target)
  let held = false
  const waiting: { upstream: Socket; chunk: Buffer | string }[] = []
  const sockets = new Set<Socket>()
  const stalled = new WeakSet<Socket>()
  const clients = new Set<Socket>()
  const injections = new Map<Socket, Buffer>()
  const server = createServer(client => {
    const upstream = connect(Number(port), hostname)
    clients.add(client)
    client.on('close', () => (clients.delete(client), injections.delete(client)))
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => socket.destroy())
    }
    client.on('data', chunk => void (stalled.has(client) || (held ? waiting.push({ upstream, chunk }) : upstream.write(chunk))))
    upstream.on('data', chunk => {
      if (stalled.has(upstream)) return
      const injected = injections.get(client)
      if (injected) {
        injections.delete(client)
        client.write(injected)
      }
      client.write(chunk)
    })
    client.on('close', () => void (stalled.has(client) || upstream.destroy()))
    upstream.on('close', () => void (stalled.has(upstream) || client.destroy()))
  })
  const listen = (at: number) => new Promise<void>(resolve => server.listen(at, '127.0.0.1', resolve))
  const stop = async () => {
    // Refuse new connections first, then drop the open ones, which close() waits for.
    const closed = server.listening ? new Promise<void>(resolve => server.close(() => resolve())) : undefined
    for (const socket of sockets) socket.destroy()
    await closed
  }
  await listen(0)
  const address = server.address()
  if (!address || typeof address === 'string') throw new Error('the proxy has no port')
  return {
    url: `${protocol}//127.0.0.1:${address.port}`,
    hold: () => void (held = true),
    release() {
      held = false
      for (const { upstream, chunk } of waiting.splice(0)) upstream.write(chunk)
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
    stop,
    restart: () => listen(address.port),
    close: stop,
  }
}
