/** A client that stops reading is cut off before its backlog grows without bound; it resumes by id. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { connect, type Socket } from 'node:net'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { serve } from './helpers/sse.ts'
import { enqueueEvents } from '../src/events/outbox.ts'

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
