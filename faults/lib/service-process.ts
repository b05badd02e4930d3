/** The service as real processes (`bun src/main.ts --api|--workers`): output kept, exits recorded, killed on purpose or cleaned up. */
import { appendFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { killOnExit } from './children.ts'

export const projectRoot = join(import.meta.dir, '..', '..')

export type Role = 'api' | 'workers'

export interface ServiceProcess {
  /** e.g. `api-1`, `workers` (and `#2` for a replacement). */
  name: string
  role: Role
  port?: number
  proc: Subprocess<'ignore', 'pipe', 'pipe'>
  startedAt: number
  /** Set when the suite kills it on purpose: its exit is then expected. */
  killedOnPurpose: boolean
  /** JSON log lines (stdout) and stderr, as they came. */
  stdoutLines: string[]
  stderr(): string
  /** Resolves when a stdout line matches. */
  waitForLine(match: (line: string) => boolean, ms: number): Promise<number>
  kill(signal: 'SIGKILL' | 'SIGTERM'): Promise<void>
}

/** Starts `bun src/main.ts --<role>` with exactly `env` (nothing leaks in from the test runner). */
export function startServiceProcess(name: string, role: Role, env: Record<string, string>, logFile: string): ServiceProcess {
  const proc = Bun.spawn([process.execPath, 'src/main.ts', `--${role}`], {
    cwd: projectRoot,
    env,
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const unregister = killOnExit(proc)
  const stdoutLines: string[] = []
  let stderr = ''
  const watchers: { match: (line: string) => boolean; resolve: (at: number) => void }[] = []
  void (async () => {
    const text = new TextDecoder()
    let partial = ''
    for await (const chunk of proc.stdout) {
      appendFileSync(logFile, chunk)
      partial += text.decode(chunk, { stream: true })
      const lines = partial.split('\n')
      partial = lines.pop() ?? ''
      for (const line of lines) {
        stdoutLines.push(line)
        for (const watcher of [...watchers]) {
          if (watcher.match(line)) {
            watchers.splice(watchers.indexOf(watcher), 1)
            watcher.resolve(Date.now())
          }
        }
      }
    }
  })()
  void (async () => {
    const text = new TextDecoder()
    for await (const chunk of proc.stderr) {
      appendFileSync(logFile, chunk)
      stderr += text.decode(chunk, { stream: true })
    }
  })()
  void proc.exited.then(() => unregister())

  const service: ServiceProcess = {
    name,
    role,
    port: env.PORT ? Number(env.PORT) : undefined,
    proc,
    startedAt: Date.now(),
    killedOnPurpose: false,
    stdoutLines,
    stderr: () => stderr,
    waitForLine(match, ms) {
      if (stdoutLines.some(match)) return Promise.resolve(Date.now())
      return new Promise((resolve, reject) => {
        let settled = false
        const settle = (error: Error | null, at = Date.now()) => {
          if (settled) return
          settled = true
          clearTimeout(timer)
          const index = watchers.indexOf(watcher)
          if (index >= 0) watchers.splice(index, 1)
          if (error) reject(error)
          else resolve(at)
        }
        const watcher = { match, resolve: (at: number) => settle(null, at) }
        const timer = setTimeout(() => settle(new Error(`${name}: no such log line within ${ms} ms; stderr: ${tail(stderr, 10)}`)), ms)
        watchers.push(watcher)
        void proc.exited.then(code => settle(new Error(`${name} exited with ${code ?? proc.signalCode} while starting: ${tail(stderr, 20)}`)))
      })
    },
    async kill(signal) {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal)
      await proc.exited
    },
  }
  return service
}

/** Whether the process is still running. */
export function running(service: ServiceProcess): boolean {
  return service.proc.exitCode === null && service.proc.signalCode === null
}

/** The last `lines` lines of a text. */
export function tail(text: string, lines: number): string {
  return text.trimEnd().split('\n').slice(-lines).join('\n')
}

/** Polls GET /health on the process until it answers 200; throws if it exits first or takes longer than `ms`. */
export async function waitHealthy(service: ServiceProcess, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (!running(service))
      throw new Error(
        `${service.name} exited with ${service.proc.exitCode ?? service.proc.signalCode} before answering: ${tail(service.stderr(), 20)}`,
      )
    try {
      const response = await fetch(`http://127.0.0.1:${service.port}/health`, { signal: AbortSignal.timeout(2000) })
      if (response.status === 200) return
    } catch {
      // not listening yet
    }
    await Bun.sleep(50)
  }
  throw new Error(`${service.name} did not answer /health with 200 within ${ms} ms`)
}

/** Polls until the process accepts HTTP connections at all (any status); resolves with when it first did. */
export async function waitAccepting(service: ServiceProcess, ms = 30_000): Promise<number> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (!running(service))
      throw new Error(`${service.name} exited with ${service.proc.exitCode ?? service.proc.signalCode}: ${tail(service.stderr(), 20)}`)
    const began = Date.now()
    try {
      await fetch(`http://127.0.0.1:${service.port}/health`, { signal: AbortSignal.timeout(1000) })
      return began
    } catch {
      await Bun.sleep(20)
    }
  }
  throw new Error(`${service.name} did not accept connections within ${ms} ms`)
}
