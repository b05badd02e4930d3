/** Real processes of the service in tests: started from scratch environments, always cleaned up. */
import type { Subprocess } from 'bun'
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'node:net'
import { redisUrl, testJwtSecret } from './context.ts'

export const projectRoot = join(import.meta.dir, '..', '..')

export interface Started {
  proc: Subprocess<'ignore', 'pipe', 'pipe'>
  stdout: Promise<string>
  stderr: Promise<string>
}

/** Processes started by one test file; `killAll` in its afterAll ends any a failed test left. */
export function processGroup() {
  const running: Subprocess[] = []
  return {
    /** Runs Bun with `args`, or another program when `program` names it (e.g. `['npm', 'start']`). */
    start(args: string[], env: Record<string, string>, program: string[] = [process.execPath]): Started {
      const proc = Bun.spawn([...program, ...args], { cwd: projectRoot, env, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
      running.push(proc)
      return { proc, stdout: new Response(proc.stdout).text(), stderr: new Response(proc.stderr).text() }
    },
    async killAll() {
      for (const proc of running) if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
      await Promise.all(running.map(proc => proc.exited))
    },
  }
}

/**
 * Holds a service's drain with a POST whose body never arrives in full, sends SIGTERM, checks the
 * process still waits, sends SIGTERM again; resolves with the exit code (failing after `ms`).
 */
export async function exitOnSecondSigterm(proc: Subprocess, port: number, ms: number): Promise<number | null> {
  const socket = connect(port, '127.0.0.1')
  const head = `POST /v1/participants HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{`
  try {
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject)
      socket.on('connect', () => socket.write(head, () => resolve()))
    })
    await Bun.sleep(200)
    proc.kill('SIGTERM')
    // Over a second: the same signal sooner is taken as the first delivered twice (a process group's).
    await Bun.sleep(1200)
    // The first signal waits for the open request (up to SHUTDOWN_TIMEOUT_MS).
    if (proc.exitCode !== null) throw new Error(`exited with ${proc.exitCode} on the first SIGTERM, with a request open`)
    proc.kill('SIGTERM')
    return await exitWithin(proc, ms)
  } finally {
    socket.destroy()
  }
}

/** Resolves with the exit code, or fails when the process is still running after `ms`. */
export async function exitWithin(proc: Subprocess, ms: number): Promise<number | null> {
  const timeout = Bun.sleep(ms).then(() => 'timeout' as const)
  const result = await Promise.race([proc.exited, timeout])
  if (result === 'timeout') throw new Error(`process ${proc.pid} still running after ${ms} ms`)
  return result
}

/** The processes below `pid` (children, theirs, ...), read from /proc: pid and command line. */
export function descendants(pid: number): { pid: number; parent: number; command: string }[] {
  const children = new Map<number, number[]>()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    const parent = parentOf(Number(entry))
    if (parent !== null) children.set(parent, [...(children.get(parent) ?? []), Number(entry)])
  }
  const found: { pid: number; parent: number; command: string }[] = []
  const walk = (parent: number) => {
    for (const child of children.get(parent) ?? []) {
      found.push({ pid: child, parent, command: commandOf(child) })
      walk(child)
    }
  }
  walk(pid)
  return found
}

/** Whether a process is still running (a zombie awaiting its parent's wait counts as ended). */
export function isRunning(pid: number): boolean {
  const stat = statOf(pid)
  return stat !== null && stat.state !== 'Z' && stat.state !== 'X'
}

function parentOf(pid: number): number | null {
  return statOf(pid)?.parent ?? null
}

function statOf(pid: number): { state: string; parent: number } | null {
  try {
    // The command name (field 2) is in parentheses and may hold spaces: read after its closing one.
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const [state, parent] = text.slice(text.lastIndexOf(')') + 2).split(' ')
    return { state: state!, parent: Number(parent) }
  } catch {
    return null
  }
}

function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim()
  } catch {
    return ''
  }
}

/**
 * The environment of a real deployment, built from scratch so nothing leaks in from the test runner:
 * its own Redis prefix and a data directory under `root`; an override of `undefined` leaves a
 * variable out.
 */
export function deploymentEnv(root: string, prefix: string, overrides: Record<string, string | undefined> = {}): Record<string, string> {
  const env: Record<string, string | undefined> = {
    PATH: process.env.PATH,
    HOME: process.env.HOME ?? root,
    REDIS_URL: redisUrl,
    REDIS_PREFIX: prefix,
    AUTH_JWT_SECRET: testJwtSecret,
    LOG_LEVEL: 'warn',
    NODE_ENV: 'development',
    DATA_DIR: mkdtempSync(join(root, 'data-')),
    ...overrides,
  }
  return Object.fromEntries(Object.entries(env).filter((entry): entry is [string, string] => entry[1] !== undefined))
}
