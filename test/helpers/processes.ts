/** Real processes of the service in tests: started from scratch environments, always cleaned up. */
import type { Subprocess } from 'bun'
import { join } from 'node:path'

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
    start(args: string[], env: Record<string, string>): Started {
      const proc = Bun.spawn([process.execPath, ...args], { cwd: projectRoot, env, stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
      running.push(proc)
      return { proc, stdout: new Response(proc.stdout).text(), stderr: new Response(proc.stderr).text() }
    },
    async killAll() {
      for (const proc of running) if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
      await Promise.all(running.map(proc => proc.exited))
    },
  }
}

/** Resolves with the exit code, or fails when the process is still running after `ms`. */
export async function exitWithin(proc: Subprocess, ms: number): Promise<number | null> {
  const timeout = Bun.sleep(ms).then(() => 'timeout' as const)
  const result = await Promise.race([proc.exited, timeout])
  if (result === 'timeout') throw new Error(`process ${proc.pid} still running after ${ms} ms`)
  return result
}
