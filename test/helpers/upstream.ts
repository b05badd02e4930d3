/** A real HTTP server on 127.0.0.1 standing in for a third-party API behind proxy calls. */
import type { Server } from 'bun'

export interface Upstream {
  url: string
  port: number
  /** Requests received, in order. */
  received: { method: string; path: string; query: string; headers: Record<string, string>; body: string }[]
  /** From now on /gate waits (answering like /echo) until `open`. */
  closeGate(): void
  /** Answers every /gate waiting, and those that come after, at once. */
  openGate(): void
  stop(): void
}

/**
 * Routes: /echo (JSON of what arrived), /gate (as /echo, once the gate is open), /status/<n>, /hang
 * (never answers), /big (5 MiB), /redirect (302 to /echo), /deep/<n> (JSON arrays nested n deep),
 * /bad-gzip (a body that is not the gzip its Content-Encoding says), /huge-number (JSON with a number
 * past a double's range), /latin1 (`café` in ISO-8859-1, as its Content-Type says);
 * anything else 404.
 */
export function startUpstream(): Upstream {
  const received: Upstream['received'] = []
  let gate: { opened: Promise<void>; open(): void } | null = null
  const server: Server<unknown> = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    idleTimeout: 30,
    async fetch(request) {
      const url = new URL(request.url)
      const body = await request.text()
      received.push({
        method: request.method,
        path: url.pathname,
        query: url.search,
        headers: Object.fromEntries(request.headers),
        body,
      })
      const path = url.pathname.replace(/^\/api/, '')
      if (path === '/gate') await gate?.opened
      if (path === '/echo' || path === '/gate') {
        return Response.json({ method: request.method, path: url.pathname, query: url.search, headers: Object.fromEntries(request.headers), body })
      }
      const status = /^\/status\/(\d{3})$/.exec(path)
      if (status) return new Response('status page', { status: Number(status[1]), headers: { 'content-type': 'text/plain' } })
      if (path === '/hang') return new Promise<Response>(() => {})
      if (path === '/big') return new Response('x'.repeat(5 * 1024 * 1024), { headers: { 'content-type': 'text/plain' } })
      if (path === '/bad-gzip') return new Response('not gzip at all', { headers: { 'content-type': 'text/plain', 'content-encoding': 'gzip' } })
      if (path === '/redirect') return new Response(null, { status: 302, headers: { location: '/echo' } })
      if (path === '/latin1') {
        return new Response(new Uint8Array([0x63, 0x61, 0x66, 0xe9]), { headers: { 'content-type': 'text/plain; charset=ISO-8859-1' } })
      }
      if (path === '/huge-number') return new Response('{"id":1e400,"n":[-1e999]}', { headers: { 'content-type': 'application/json' } })
      const deep = /^\/deep\/(\d+)$/.exec(path)
      if (deep) {
        const depth = Number(deep[1])
        return new Response('['.repeat(depth) + ']'.repeat(depth), { headers: { 'content-type': 'application/json' } })
      }
      return new Response('no such thing', { status: 404 })
    },
  })
  return {
    url: `http://127.0.0.1:${server.port}`,
    port: server.port!,
    received,
    closeGate() {
      let open!: () => void
      const opened = new Promise<void>(resolve => (open = resolve))
      gate = { opened, open }
    },
    openGate() {
      gate?.open()
      gate = null
    },
    stop: () => void server.stop(true),
  }
}
