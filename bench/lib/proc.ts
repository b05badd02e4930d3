/** Server processes of a bench run: spawned (pinned to a core), waited for, measured through /proc, stopped. */
import type { Subprocess } from 'bun'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

export const root = join(import.meta.dir, '..', '..')
export const outDir = join(root, 'bench', '.out')
// Logs and profiles land here; a fresh clone does not have it (it is not committed).
mkdirSync(outDir, { recursive: true })

// The full path: the servers' environment is their own and may have no PATH to look it up in.
const taskset = Bun.which('taskset')
const hasTaskset = taskset !== null
const ticksPerSecond = 100

export interface Server {
  /** The log's name (bench/.out/<name>.log). */
  name: string
  /** What the report calls it: baseline, api, workers. */
  role: string
  pid: number
  url: string
  proc: Subprocess
  /** SIGTERM, then SIGKILL after `ms`; resolves with the exit code. */
  stop(ms?: number): Promise<number | null>
}

/** Pins this process (every thread) to one core; false when taskset is missing. */
export function pinSelf(cpu: number): boolean {
  if (!hasTaskset) return false
  return Bun.spawnSync([taskset, '-apc', String(cpu), String(process.pid)], { stdout: 'ignore', stderr: 'ignore' }).exitCode === 0
}

/** The open-file limit of this process (soft). */
export function openFilesLimit(): number {
  return Number(/^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? 0)
}

/**
 * Raises this process's open-file limit (soft and hard) to `n` with prlimit, so the servers spawned
 * after it inherit it too; false when that is not allowed (not root) or prlimit is missing.
 */
export function raiseOpenFiles(n: number): boolean {
  const prlimit = Bun.which('prlimit')
  if (!prlimit) return false
  const run = Bun.spawnSync([prlimit, `--pid=${process.pid}`, `--nofile=${n}:${n}`], { stdout: 'ignore', stderr: 'ignore' })
  return run.exitCode === 0 && openFilesLimit() >= n
}

export function spawnBun(
  name: string,
  args: string[],
  env: Record<string, string>,
  options: { cpu?: number; port?: number; role?: string } = {},
): Server {
  // taskset execs the command, so the pid is the server's own.
  const pin = hasTaskset && options.cpu !== undefined ? [taskset, '-c', String(options.cpu)] : []
  const log = Bun.file(join(outDir, `${name}.log`))
  const proc = Bun.spawn([...pin, process.execPath, ...args], { cwd: root, env, stdin: 'ignore', stdout: log, stderr: log })
  return {
    name,
    role: options.role ?? name,
    pid: proc.pid,
    url: `http://127.0.0.1:${options.port ?? 0}`,
    proc,
    async stop(ms = 15_000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode
      proc.kill('SIGTERM')
      const timer = setTimeout(() => proc.kill('SIGKILL'), ms)
      const code = await proc.exited
      clearTimeout(timer)
      return code
    },
  }
}

/** Polls `url` until it answers 200, or fails naming the server's log. */
export async function waitHealthy(server: Server, path = '/health', ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms
  for (;;) {
    if (server.proc.exitCode !== null) throw new Error(`${server.name} exited with ${server.proc.exitCode}; see bench/.out/${server.name}.log`)
    try {
      const response = await fetch(server.url + path)
      if (response.ok) return
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${server.name} not healthy within ${ms} ms; see bench/.out/${server.name}.log`)
    await Bun.sleep(100)
  }
}

/** VmRSS and VmHWM (peak since start or the last reset) in MB. */
export function memory(pid: number): { rssMb: number; peakMb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0)
  return { rssMb: kb('VmRSS') / 1024, peakMb: kb('VmHWM') / 1024 }
}

/** Resets VmHWM to the current RSS (Linux clear_refs 5); false where not allowed. */
export function resetPeak(pid: number): boolean {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5')
    return true
  } catch {
    return false
  }
}

/** CPU seconds (user + system) the process has used. */
export function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  return (Number(fields[11]) + Number(fields[12])) / ticksPerSecond
}

export interface Watched {
  /** Peak RSS (MB) since the watch began. */
  peakMb: number
  /** CPU seconds (user + system) used since the watch began. */
  cpuSeconds: number
}

export interface Watch {
  /** Each watched process's figures by role, and the seconds watched. */
  stop(): { processes: Record<string, Watched>; seconds: number }
}

/**
 * Watches processes through a scenario: resets their peak, samples RSS every 100 ms (in case the
 * reset is refused) and measures the CPU they use.
 */
export function watch(servers: Server[]): Watch {
  const started = performance.now()
  const state = servers.map(server => {
    const reset = resetPeak(server.pid)
    return { server, reset, cpu: cpuSeconds(server.pid), sampled: memory(server.pid).rssMb }
  })
  const timer = setInterval(() => {
    for (const s of state) {
      try {
        s.sampled = Math.max(s.sampled, memory(s.server.pid).rssMb)
      } catch {
        // exited
      }
    }
  }, 100)
  return {
    stop() {
      clearInterval(timer)
      const processes: Record<string, Watched> = {}
      for (const s of state) {
        const m = memory(s.server.pid)
        processes[s.server.role] = {
          // Without the reset VmHWM is the peak since start, which may belong to an earlier scenario.
          peakMb: Math.max(s.sampled, m.rssMb, s.reset ? m.peakMb : 0),
          cpuSeconds: cpuSeconds(s.server.pid) - s.cpu,
        }
      }
      return { processes, seconds: (performance.now() - started) / 1000 }
    },
  }
}
