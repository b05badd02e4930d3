/**
 * A Redis of a test's own: `redis-server` as a child on a spare port, persistent like production
 * (append-only file in a temporary directory; snapshots, or a directory of the test's, if asked), taken
 * down keeping its files (data kept) or without them (data lost), and brought up again on the same port.
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { freePort } from './ports.ts'

export interface RedisServer {
  url: string
  port: number
  /** Stops it: SIGTERM (Redis writes its file out) when `keepData`, else SIGKILL and the file deleted. Resolves with when. */
  down(options: { keepData: boolean }): Promise<number>
  /** Starts it again on the same port; resolves with the first moment it answered PING. */
  up(): Promise<number>
  /** Stops it answering (SIGSTOP), its connections left open, as a Redis paused or cut off by the network; `resume` goes on. */
  pause(): void
  resume(): void
  /** `down`, `downMs` after it `up`: when it went down and when it answered again. */
  restart(options: { keepData: boolean; downMs: number }): Promise<{ downAt: number; upAt: number }>
  /** The server's own output, the newest 20,000 characters. */
  output(): string
  close(): Promise<void>
}

interface Options {
  /** Where its files go (a small disk's mount), instead of a temporary directory of its own. */
  dir?: string
  /** `aof` (the default): an append-only file, fsynced every second; `rdb`: snapshots only, one a second after a change (`save 1 1`). */
  persistence?: 'aof' | 'rdb'
}

export async function startRedisServer(options: Options = {}): Promise<RedisServer> {
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), 'am-redis-'))
  // A directory handed in (a mount point) is emptied, never removed.
  const removeDir = () => {
    if (options.dir === undefined) rmSync(dir, { recursive: true, force: true })
    else for (const name of readdirSync(dir)) rmSync(join(dir, name), { recursive: true, force: true })
  }
  const port = await freePort()
  let log = ''
  let proc: Subprocess<'ignore', 'pipe', 'pipe'> | undefined
  // The last resort when the test process ends without closing it (a failure, Ctrl-C).
  const onExit = () => {
    proc?.kill('SIGKILL')
    removeDir()
  }
  process.once('exit', onExit)

  const up = async () => {
    // `everysec` suffices: the restart that keeps data is Redis's own shutdown, which writes the file out.
    const persistence = options.persistence === 'rdb' ? ['--save', '1 1', '--appendonly', 'no'] : ['--save', '', '--appendonly', 'yes']
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, ...persistence]
    proc = Bun.spawn(
      ['redis-server', ...args, '--appendfsync', 'everysec', '--maxmemory-policy', 'noeviction', '--daemonize', 'no', '--logfile', ''],
      {
        stdin: 'ignore',
        stdout: 'pipe',
        stderr: 'pipe',
      },
    )
    const keep = async (stream: ReadableStream<Uint8Array>) => {
      for await (const chunk of stream) log = (log + new TextDecoder().decode(chunk)).slice(-20_000)
    }
    void keep(proc.stdout)
    void keep(proc.stderr)
    const started = proc
    const deadline = Date.now() + 15_000
    for (;;) {
      const began = Date.now()
      if (await answersPing(port)) return began
      if (started.exitCode !== null) throw new Error(`redis-server exited with ${started.exitCode}: ${log.slice(-2000)}`)
      if (Date.now() > deadline) throw new Error(`redis-server on port ${port} did not answer within 15 s`)
      await Bun.sleep(20)
    }
  }

  const down = async ({ keepData }: { keepData: boolean }) => {
    const at = Date.now()
    if (proc) {
      // A paused server takes no signal but SIGKILL until it goes on.
      proc.kill('SIGCONT')
      proc.kill(keepData ? 'SIGTERM' : 'SIGKILL')
      await proc.exited
      proc = undefined
    }
    if (!keepData) {
      removeDir()
      mkdirSync(dir, { mode: 0o700, recursive: true })
    }
    return at
  }

  await up()
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    down,
    up,
    pause: () => proc?.kill('SIGSTOP'),
    resume: () => proc?.kill('SIGCONT'),
    async restart({ keepData, downMs }) {
      const downAt = await down({ keepData })
      await Bun.sleep(Math.max(0, downAt + downMs - Date.now()))
      return { downAt, upAt: await up() }
    },
    output: () => log,
    async close() {
      await down({ keepData: false })
      process.off('exit', onExit)
      removeDir()
    },
  }
}

/** One PING on a fresh connection; true only for +PONG (a Redis still loading its data answers -LOADING). */
function answersPing(port: number, ms = 500): Promise<boolean> {
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
