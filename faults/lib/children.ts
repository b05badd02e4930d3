/** Every child process and server the fault suite starts, ended on exit whatever way the run ends. */
import type { Subprocess } from 'bun'

const cleanups = new Set<() => void>()
let hooked = false

/**
 * Registers a synchronous last-resort cleanup (kill a child, stop a server) run when the test
 * process exits, also after a failure or Ctrl-C; returns the function that unregisters it once the
 * owner has cleaned up by itself.
 */
export function onExit(cleanup: () => void): () => void {
  if (!hooked) {
    hooked = true
    const runAll = () => {
      for (const run of [...cleanups]) {
        try {
          run()
        } catch {
          // best effort: the others still run
        }
      }
      cleanups.clear()
    }
    process.on('exit', runAll)
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.on(signal, () => {
        runAll()
        process.exit(130)
      })
    }
  }
  cleanups.add(cleanup)
  return () => void cleanups.delete(cleanup)
}

/** Kills a child with SIGKILL when the run ends before its owner stopped it. */
export function killOnExit(proc: Subprocess): () => void {
  return onExit(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
  })
}

/** Runs a command to its end; throws with its output when it fails. */
export async function run(cmd: string[], options: { allowFailure?: boolean } = {}): Promise<{ code: number; output: string }> {
  const proc = Bun.spawn(cmd, { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  const output = (out + err).trim()
  if (code !== 0 && !options.allowFailure) throw new Error(`${cmd.join(' ')} exited with ${code}: ${output}`)
  return { code, output }
}
