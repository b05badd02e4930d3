/**
 * A Redis of the suite's own: `redis-server` as a child on a spare port, its append-only file in a
 * temporary directory, restarted keeping that file (data kept) or without it (data lost).
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { firstSuccess, redisAnswersPing } from './accepting.ts'
import { killOnExit } from './children.ts'
import { freePort } from '../../test/helpers/ports.ts'

export interface RedisServer {
  url: string
  port: number
  /**
   * Stops the server, waits `downMs`, starts it again on the same port; `keepData` false deletes
   * the append-only file meanwhile, as a restart after FLUSHALL or onto a new machine. Resolves
   * with when it went down and when it answered PING again.
   */
  restart(options: { keepData: boolean; downMs: number }): Promise<{ downAt: number; upAt: number }>
  /** The server's own output, last lines first to go. */
  output(): string
  close(): Promise<void>
}

export async function startRedisServer(): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), 'am-faults-redis-'))
  const port = await freePort()
  let log = ''
  let proc: Subprocess<'ignore', 'pipe', 'pipe'> | undefined
  let unregister = () => {}

  const start = async () => {
    // Persistent as production should be (README, Operations). `everysec` suffices: the restart that
    // keeps data is Redis's own shutdown (SIGTERM), which writes the file out in full.
    proc = Bun.spawn(
      [
        'redis-server',
        '--port', String(port),
        '--bind', '127.0.0.1',
        '--dir', dir,
        '--save', '',
        '--appendonly', 'yes',
        '--appendfsync', 'everysec',
        '--maxmemory-policy', 'noeviction',
        '--daemonize', 'no',
        '--logfile', '',
      ],
      { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' },
    )
    unregister = killOnExit(proc)
    const keep = async (stream: ReadableStream<Uint8Array>) => {
      for await (const chunk of stream) log = (log + new TextDecoder().decode(chunk)).slice(-20_000)
    }
    void keep(proc.stdout)
    void keep(proc.stderr)
    const started = proc
    return firstSuccess(async () => {
      if (started.exitCode !== null) throw new Error(`redis-server exited with ${started.exitCode}: ${log.slice(-2000)}`)
      return redisAnswersPing(port)
    }, `redis-server on port ${port}`, 15_000)
  }

  const stop = async (signal: 'SIGTERM' | 'SIGKILL') => {
    if (!proc) return
    // SIGTERM: Redis's own shutdown, which writes out the append-only file.
    proc.kill(signal)
    await proc.exited
    unregister()
    proc = undefined
  }

  await start()
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    async restart({ keepData, downMs }) {
      const downAt = Date.now()
      if (keepData) {
        await stop('SIGTERM')
      } else {
        await stop('SIGKILL')
        rmSync(dir, { recursive: true, force: true })
        mkdirSync(dir, { mode: 0o700 })
      }
      await Bun.sleep(Math.max(0, downAt + downMs - Date.now()))
      const upAt = await start()
      return { downAt, upAt }
    },
    output: () => log,
    async close() {
      await stop('SIGKILL')
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
