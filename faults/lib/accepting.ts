/** Whether a restarted Redis accepts connections again (PostgreSQL's is test/helpers/postgres-server.ts's restart). */
import { connect } from 'node:net'

/** One PING on a fresh connection; true only for +PONG (a Redis still loading its data answers -LOADING). */
export function redisAnswersPing(port: number, ms = 500): Promise<boolean> {
  return new Promise(resolve => {
    const socket = connect(port, '127.0.0.1')
    let reply = ''
    const done = (ok: boolean) => {
      clearTimeout(timer)
      socket.destroy()
      resolve(ok)
    }
    const timer = setTimeout(() => done(false), ms)
    socket.on('connect', () => socket.write('PING\r\n'))
    socket.on('data', chunk => {
      reply += chunk.toString()
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'))
    })
    socket.on('error', () => done(false))
  })
}

/**
 * Polls `check` every `everyMs` until it holds; resolves with the time (Date.now()) the successful
 * check began (the server came up within one poll of it), or throws after `ms`.
 */
export async function firstSuccess(check: () => Promise<boolean>, what: string, ms = 30_000, everyMs = 20): Promise<number> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    const began = Date.now()
    if (await check()) return began
    await Bun.sleep(everyMs)
  }
  throw new Error(`${what} did not accept connections within ${ms} ms`)
}
