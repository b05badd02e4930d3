/** The Debian packages the tests install where missing, with two test processes of a parallel run at it at once. */
import { afterAll, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { installDebianPackage } from './helpers/debian.ts'

// The package archive is the outside world: an `apt-get` of its own on PATH stands in for the real one.
// It answers as apt-get 2.6 does while another apt-get holds the package lists' lock (`apt-get update`
// exits 100 at once, whatever DPkg::Lock::Timeout says), its first `refusals` times, then installs.
const dir = mkdtempSync(join(tmpdir(), 'am-apt-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

function fakeAptGet(refusals: number, error = 'E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)') {
  const calls = join(dir, 'calls')
  const target = join(dir, 'installed-binary')
  writeFileSync(calls, '')
  rmSync(target, { force: true })
  writeFileSync(
    join(dir, 'apt-get'),
    `#!/bin/sh
echo "$*" >> ${calls}
if [ "$(wc -l < ${calls})" -le ${refusals} ]; then echo '${error}' >&2; exit 100; fi
if [ "$1" = install ]; then touch ${target}; fi
exit 0
`,
  )
  chmodSync(join(dir, 'apt-get'), 0o755)
  return { target, calls: () => readFileSync(calls, 'utf8').trim().split('\n') }
}

const path = process.env.PATH
afterAll(() => (process.env.PATH = path))
process.env.PATH = `${dir}:${path}`

test('an install turned away by another apt-get’s lock tries again until it gets it', async () => {
  const apt = fakeAptGet(3)
  expect(await installDebianPackage('pgbouncer', apt.target)).toBe(apt.target)
  const calls = apt.calls()
  expect(calls.slice(0, 4)).toEqual(['update -qq', 'update -qq', 'update -qq', 'update -qq'])
  expect(calls[4]).toStartWith('install ')
  expect(existsSync(apt.target)).toBe(true)
})

test('any other failure of apt-get fails the install at once, saying why', async () => {
  const apt = fakeAptGet(1, 'E: Unable to locate package pgbouncer')
  await expect(installDebianPackage('pgbouncer', apt.target)).rejects.toThrow('apt-get update -qq failed (100): E: Unable to locate package')
  expect(apt.calls()).toHaveLength(1)
})
