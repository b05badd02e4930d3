/** Scenario 4, streams: world-chat SSE connections on one API process and a message's delivery to all of them. */
import type { Socket } from 'bun'
import { SignJWT } from 'jose'
import { memory, resetPeak, type Server } from '../lib/proc.ts'
import { summarize } from '../lib/stats.ts'
import type { StreamsRun } from '../lib/types.ts'

interface Stream {
  ready: boolean
  onReady: () => void
  /** Refused (an answer other than 200): says which, at once rather than at the 30 s deadline. */
  onRefused: (head: string) => void
  /** The end of the last chunk, so a marker split between chunks is still found. */
  tail: string
  arrived: Map<number, number>
}

const marker = /bench-msg-(\d+)"/g
const decoder = new TextDecoder()

/**
 * Opens the streams as raw TCP sockets (cheaper to hold than fetch), then posts chat messages and
 * times each from the POST's send to its arrival on every stream; reads the API's memory throughout.
 */
export async function streamsScenario(
  api: Server,
  options: { streams: number; messages: number; jwtSecret: string; progress: (line: string) => void },
): Promise<Omit<StreamsRun, 'asked' | 'openFilesLimit'>> {
  const port = Number(new URL(api.url).port)
  const request = `GET /v1/events/chat HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAccept: text/event-stream\r\n\r\n`
  await Bun.sleep(1000)
  const rssIdleMb = memory(api.pid).rssMb
  const reset = resetPeak(api.pid)
  let sampledPeak = rssIdleMb
  const sampler = setInterval(() => (sampledPeak = Math.max(sampledPeak, memory(api.pid).rssMb)), 100)

  const streams: Stream[] = []
  const sockets: Socket<Stream>[] = []
  const open = async (): Promise<void> => {
    const stream: Stream = { ready: false, onReady: () => {}, onRefused: () => {}, tail: '', arrived: new Map() }
    const ready = new Promise<void>((resolve, reject) => {
      stream.onReady = resolve
      stream.onRefused = head => reject(new Error(`refused: ${head}`))
      setTimeout(() => reject(new Error('no retry line within 30 s')), 30_000)
    })
    // Handled here too, so a connect that throws leaves no unhandled rejection behind.
    ready.catch(() => {})
    const socket = await Bun.connect<Stream>({
      hostname: '127.0.0.1',
      port,
      data: stream,
      socket: {
        open: s => void s.write(request),
        data(s, chunk) {
          const now = performance.now()
          const state = s.data
          const text = state.tail + decoder.decode(chunk)
          if (!state.ready && /^HTTP\/1\.1 (?!200)/.test(text)) state.onRefused(text.slice(0, text.indexOf('\r')))
          if (!state.ready && text.includes('retry: 3000')) {
            state.ready = true
            state.onReady()
          }
          for (const match of text.matchAll(marker)) {
            const n = Number(match[1])
            if (!state.arrived.has(n)) state.arrived.set(n, now)
          }
          state.tail = text.slice(-48)
        },
      },
    })
    sockets.push(socket)
    await ready
    streams.push(stream)
  }

  const started = performance.now()
  const batch = 250
  for (let i = 0; i < options.streams; i += batch) {
    const results = await Promise.allSettled(Array.from({ length: Math.min(batch, options.streams - i) }, open))
    const failed = results.filter(r => r.status === 'rejected')
    if (failed.length > 0) options.progress(`  ${failed.length} streams failed to open: ${(failed[0] as PromiseRejectedResult).reason}`)
    if ((i / batch) % 4 === 3) options.progress(`  ${streams.length} streams open`)
  }
  const openSeconds = (performance.now() - started) / 1000
  await Bun.sleep(2000)
  const rssOpenMb = memory(api.pid).rssMb
  options.progress(`  ${streams.length} streams open in ${openSeconds.toFixed(1)} s; API RSS ${rssOpenMb.toFixed(0)} MB`)

  const token = await new SignJWT({ email: 'chatter@bench.local' })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject('bench-chatter')
    .setIssuedAt()
    .setExpirationTime('1h')
    .sign(new TextEncoder().encode(options.jwtSecret))
  // The first call creates the user; the timed ones start after.
  await fetch(`${api.url}/v1/auth/me`, { headers: { authorization: `Bearer ${token}` } })

  const messages: StreamsRun['messages'] = []
  const all: number[] = []
  let allMissing = 0
  for (let n = 1; n <= options.messages; n++) {
    const sentAt = performance.now()
    const response = await fetch(`${api.url}/v1/chat/messages`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ text: `bench-msg-${n}` }),
    })
    if (response.status !== 201) throw new Error(`chat post answered ${response.status}: ${await response.text()}`)
    const deadline = Date.now() + 10_000
    while (streams.some(s => !s.arrived.has(n)) && Date.now() < deadline) await Bun.sleep(5)
    const latencies = streams.filter(s => s.arrived.has(n)).map(s => s.arrived.get(n)! - sentAt)
    const missing = streams.length - latencies.length
    messages.push({ delivered: latencies.length, missing, ...summarize(latencies) })
    all.push(...latencies)
    allMissing += missing
    const last = messages[messages.length - 1]!
    options.progress(
      `  message ${n}: ${last.delivered} delivered, p50 ${last.p50.toFixed(1)} ms, p99 ${last.p99.toFixed(1)} ms, max ${last.max.toFixed(1)} ms`,
    )
    await Bun.sleep(500)
  }

  clearInterval(sampler)
  const { peakMb, rssMb } = memory(api.pid)
  for (const socket of sockets) socket.end()
  return {
    streams: options.streams,
    opened: streams.length,
    openSeconds,
    rssIdleMb,
    rssOpenMb,
    peakMb: Math.max(sampledPeak, rssMb, reset ? peakMb : 0),
    messages,
    all: { delivered: all.length, missing: allMissing, ...summarize(all) },
  }
}
