/** Debian's Chromium for the browser tests: installed with apt-get when it is missing (tests run as root here and in CI). */
import { existsSync } from 'node:fs'

export const chromiumPath = '/usr/bin/chromium'

/** Flags for a headless run that reaches out to nothing on its own (no updates, sync or metrics). */
export const chromiumArgs = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

let installing: Promise<string> | undefined

/** The path of Chromium, installing the Debian package first if needed (a minute or two, once). */
export function chromium(): Promise<string> {
  if (existsSync(chromiumPath)) return Promise.resolve(chromiumPath)
  installing ??= install()
  return installing
}

async function install(): Promise<string> {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  // Another apt-get (a parallel run) holds the lock for a while: wait for it rather than fail.
  for (const command of [
    ['apt-get', 'update', '-qq'],
    ['apt-get', 'install', '-y', '-qq', '-o', 'DPkg::Lock::Timeout=300', 'chromium'],
  ]) {
    const child = Bun.spawn(command, { env, stdout: 'ignore', stderr: 'pipe' })
    const [code, stderr] = await Promise.all([child.exited, new Response(child.stderr).text()])
    if (code !== 0) throw new Error(`${command.join(' ')} failed (${code}): ${stderr.trim().slice(-500)}`)
  }
  if (!existsSync(chromiumPath)) throw new Error(`apt-get installed chromium, but ${chromiumPath} is missing`)
  return chromiumPath
}
