/** Debian packages the tests need (Chromium, nginx, HAProxy, promtool), installed once per process where missing. */
import { existsSync } from 'node:fs'

const installing = new Map<string, Promise<string>>()

/** `path`, installing the Debian package `name` first if it is missing (its service, if any, is not started). */
export function debianPackage(name: string, path: string): Promise<string> {
  if (existsSync(path)) return Promise.resolve(path)
  let pending = installing.get(name)
  if (!pending) installing.set(name, (pending = installDebianPackage(name, path)))
  return pending
}

/**
 * apt-get refusing to start while another apt-get holds its lock: that of another test process of a
 * parallel run installing a package of its own. `apt-get update` takes the package lists' lock
 * without waiting, whatever `DPkg::Lock::Timeout` says, so each command is tried again meanwhile.
 */
const lockedOut = /^E: Could not get lock /m
const lockWaitMs = 300_000

/** Installs the Debian package `name` (apt-get update, then install), waiting for another apt-get's lock; resolves with `path`. */
export async function installDebianPackage(name: string, path: string): Promise<string> {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  const deadline = performance.now() + lockWaitMs
  for (const command of [
    ['apt-get', 'update', '-qq'],
    ['apt-get', 'install', '-y', '-qq', '-o', 'DPkg::Lock::Timeout=300', name],
  ]) {
    for (;;) {
      const child = Bun.spawn(command, { env, stdout: 'ignore', stderr: 'pipe' })
      const [code, stderr] = await Promise.all([child.exited, new Response(child.stderr).text()])
      if (code === 0) break
      if (!lockedOut.test(stderr) || performance.now() > deadline) {
        throw new Error(`${command.join(' ')} failed (${code}): ${stderr.trim().slice(-500)}`)
      }
      await Bun.sleep(500)
    }
  }
  if (!existsSync(path)) throw new Error(`apt-get installed ${name}, but ${path} is missing`)
  return path
}
