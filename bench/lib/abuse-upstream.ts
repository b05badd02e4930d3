/** A slow third-party API on 127.0.0.1 for the proxy-call vector: it waits, then answers with nearly 1 MiB. */
import type { Server } from 'bun'

/** Just under the proxy's 1 MiB cap on an upstream's answer, so every call is buffered whole. */
export const upstreamBodyBytes = 1024 * 1024 - 1024

export interface SlowUpstream {
  url: string
  /** Requests answered so far. */
  answered(): number
  stop(): Promise<void>
}

export function startSlowUpstream(delayMs: number): SlowUpstream {
  const body = JSON.stringify({ data: 'x'.repeat(upstreamBodyBytes - 20) })
  let answered = 0
  const server: Server<unknown> = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    idleTimeout: 30,
    async fetch() {
      await Bun.sleep(delayMs)
      answered++
      return new Response(body, { headers: { 'content-type': 'application/json' } })
    },
  })
  return {
    url: `http://127.0.0.1:${server.port}`,
    answered: () => answered,
    stop: () => server.stop(true),
  }
}
