/** A client that stops reading is cut off before its backlog grows without bound; it resumes by id. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { connect, type Socket } from 'node:net'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { serve } from './helpers/sse.ts'
import { enqueueEvents } from '../src/events/outbox.ts'
import { streamLength } from '../src/events/relay.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let server: { url: string; stop(): Promise<void> }

beforeAll(async () => {
  ctx = await createTestContext()
  server = serve(ctx.app)
})
afterAll(async () => {
  await server.stop()
  await ctx.close()
})

test('a stream whose client stopped reading is ended once it falls far behind; a reading one is not', async () => {
  const port = Number(new URL(server.url).port)
  const open = (paused: boolean) =>
    new Promise<Socket>(resolve => {
      const socket = connect(port, '127.0.0.1', () => {
        socket.write(`GET /v1/events/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n`)
        socket.once('data', () => {
          if (paused) socket.pause()
          resolve(socket)
        })
      })
      if (!paused) socket.on('data', () => {})
    })
  const slow = await open(true)
  const reader = await open(false)
  let slowClosed = false
  slow.on('close', () => (slowClosed = true))
  expect(ctx.deps.events.size).toBe(2)
  const text = 'x'.repeat(32 * 1024)
  for (let i = 0; i < 3000 && ctx.deps.events.size === 2; i++) {
    await enqueueEvents(ctx.deps.sql, new Date(), [{ userId: null, type: 'chat.message', payload: { i, text } }])
    if (i % 50 === 49) await ctx.relay!.drain()
  }
  const deadline = Date.now() + 10_000
  while (ctx.deps.events.size > 1 && Date.now() < deadline) await Bun.sleep(50)
  expect(ctx.deps.events.size).toBe(1)
  slow.resume()
  const closedBy = Date.now() + 10_000
  while (!slowClosed && Date.now() < closedBy) await Bun.sleep(50)
  expect(slowClosed).toBe(true)
  reader.destroy()
  slow.destroy()
}, 60_000)

test(`a resume from before every event kept gets the newest ${streamLength}, however many the stream holds`, async () => {
  const chat = ctx.deps.keys.events.chat
  // Small entries only, so that the stream is trimmed a node (100 entries) at a time: it keeps more than the cap.
  await ctx.deps.redis.del(chat)
  const events = Array.from({ length: streamLength + 50 }, (_, i) => ({ userId: null, type: 'chat.message' as const, payload: { i } }))
  await enqueueEvents(ctx.deps.sql, new Date(), events)
  await until(async () => (await ctx.deps.sql`select count(*)::int as n from outbox`)[0]!.n === 0)
  expect(await ctx.deps.redis.xlen(chat)).toBeGreaterThan(streamLength)
  const newest = (await ctx.deps.redis.xrevrange(chat, '+', '-', 'COUNT', streamLength)).map(([id]) => id).reverse()
  const response = await fetch(`${server.url}/v1/events/chat`, { headers: { 'last-event-id': '0-0' } })
  expect(response.status).toBe(200)
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  // The events' ids; the notice that the oldest are not replayed (events.missed, its id the resume's place) is not one.
  const ids = () => [...text.matchAll(/^id: (\S+)\nevent: (?!events\.missed\n)/gm)].map(match => match[1])
  while (ids().length < streamLength) {
    const { value, done } = await reader.read()
    if (done) break
    text += decoder.decode(value, { stream: true })
  }
  await reader.cancel()
  expect(ids()).toEqual(newest)
  // 50 more than it replays are in the stream: the client is told it missed some.
  expect(text).toContain('id: 0-0\nevent: events.missed\n')
}, 30_000)

test('a client yet to read its whole replay is not cut off by the events that come next', async () => {
  const chat = ctx.deps.keys.events.chat
  const waiting = async () => (await ctx.deps.sql`select count(*)::int as n from outbox`)[0]!.n === 0
  await enqueueEvents(
    ctx.deps.sql,
    new Date(),
    Array.from({ length: streamLength }, (_, i) => ({ userId: null, type: 'chat.message' as const, payload: { i } })),
  )
  await until(waiting)
  // Nothing reads the response until the next events are in: the whole replay stays queued.
  const response = await ctx.deps.events.open({ stream: chat, lastEventId: '0-0' })
  await enqueueEvents(
    ctx.deps.sql,
    new Date(),
    Array.from({ length: 20 }, (_, i) => ({ userId: null, type: 'chat.message' as const, payload: { late: i } })),
  )
  await until(waiting)
  const newest = (await ctx.deps.redis.xrevrange(chat, '+', '-', 'COUNT', 1)).map(([id]) => id)[0]!
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ''
  while (!text.includes(`id: ${newest}\n`)) {
    const { value, done } = await reader.read()
    if (done) break
    text += decoder.decode(value, { stream: true })
  }
  await reader.cancel()
  expect(text).toContain(`id: ${newest}\n`)
  expect([...text.matchAll(/^id: \S+\nevent: (?!events\.missed\n)/gm)].length).toBe(streamLength + 20)
}, 30_000)
