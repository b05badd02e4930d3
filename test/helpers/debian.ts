/** Debian packages the tests need (Chromium, nginx, HAProxy, promtool), installed once per process where missing. */
import { existsSync } from 'node:fs'

const installing = new Map<string, Promise<string>>()

/** `path`, installing the Debian package `name` first if it is missing (its service, if any, is not started). */
export function debianPackage(name: string, path: string): Promise<string> {
  if (existsSync(path)) return Promise.resolve(path)
  let pending = installing.get(name)
  if (!pending) installing.set(name, (pending = install(name, path)))
  return pending
}

async function install(name: string, path: string): Promise<string> {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  // Another apt-get (a parallel run) holds the lock for a while: wait for it rather than fail.
  for (const command of [
    ['apt-get', 'update', '-qq'],
    ['apt-get', 'install', '-y', '-qq', '-o', 'DPkg::Lock::Timeout=300', name],
  ]) {
    const child = Bun.spawn(command, { env, stdout: 'ignore', stderr: 'pipe' })
    const [code, stderr] = await Promise.all([child.exited, new Response(child.stderr).text()])
    if (code !== 0) throw new Error(`${command.join(' ')} failed (${code}): ${stderr.trim().slice(-500)}`)
  }
  if (!existsSync(path)) throw new Error(`apt-get installed ${name}, but ${path} is missing`)
  return path
}
