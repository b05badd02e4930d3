/** A throwaway `redis-server` of a test's own, on a spare port, that the test may stop and start again. */
import type { Subprocess } from 'bun'
import { connect } from 'node:net'
import { freePort } from './processes.ts'

export interface RedisServer {
  url: string
  port: number
  /** Starts it (again, on the same port, empty) and resolves once it accepts connections. */
  start(): Promise<void>
  /** Stops it and resolves once it has exited. */
  stop(): Promise<void>
}

export async function redisServer(): Promise<RedisServer> {
  const port = await freePort()
  let proc: Subprocess | undefined
  const server: RedisServer = {
    url: `redis://127.0.0.1:${port}`,
    port,
    async start() {
      proc = Bun.spawn(['redis-server', '--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no'], {
        stdin: 'ignore',
        stdout: 'ignore',
        stderr: 'ignore',
      })
      const deadline = Date.now() + 10_000
      while (!(await accepts(port))) {
        if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`redis-server on port ${port} did not start`)
        await Bun.sleep(20)
      }
    },
    async stop() {
      if (!proc || proc.exitCode !== null || proc.signalCode !== null) return
      proc.kill('SIGTERM')
      await proc.exited
    },
  }
  await server.start()
  return server
}

function accepts(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => (socket.destroy(), resolve(true)))
    socket.once('error', () => resolve(false))
  })
}
