/** Debian's Chromium for the browser tests: installed with apt-get when it is missing (tests run as root here and in CI). */
import { debianPackage } from './debian.ts'

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

/** The path of Chromium, installing the Debian package first if needed (a minute or two, once). */
export function chromium(): Promise<string> {
  return debianPackage('chromium', chromiumPath)
}
