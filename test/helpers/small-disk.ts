/**
 * A small disk of a test's own: a tmpfs mounted on a temporary directory, to be filled to the last
 * byte and freed again. Mounting needs root (CAP_SYS_ADMIN): `smallDisk` returns null where it is
 * refused, for the test to skip saying so.
 */
import { chmodSync, chownSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export interface SmallDisk {
  /** The mount point, empty at first. */
  dir: string
  /** Writes a file until the disk has no byte left (dd stops at ENOSPC). */
  fill(): void
  /** Deletes what `fill` wrote. */
  free(): void
  /** Unmounts and removes the directory; safe to call twice. */
  remove(): void
}

/** Mounts a tmpfs on a new temporary directory: the directory, or why it could not. */
function mountTmpfs(size: string): { dir: string } | { refused: string } {
  if (process.getuid?.() !== 0) return { refused: 'mounting a tmpfs needs root' }
  const dir = mkdtempSync(join(tmpdir(), 'am-disk-'))
  const mount = Bun.spawnSync(['mount', '-t', 'tmpfs', '-o', `size=${size}`, 'tmpfs', dir])
  if (mount.exitCode === 0) return { dir }
  rmSync(dir, { recursive: true, force: true })
  return { refused: `mount refused: ${mount.stderr.toString().trim().split('\n')[0] || `exit ${mount.exitCode}`}` }
}

/** Why a small disk cannot be had here (not root, or a container without CAP_SYS_ADMIN), or null when it can. */
export const smallDiskRefused = (() => {
  const probe = mountTmpfs('1m')
  if ('refused' in probe) return probe.refused
  Bun.spawnSync(['umount', probe.dir])
  rmSync(probe.dir, { recursive: true, force: true })
  return null
})()

/** A tmpfs of `size` (`1m`, `64m`) owned by `owner` (an OS user: `postgres`); null where mount is refused. */
export function smallDisk(size: string, owner?: string): SmallDisk | null {
  const mounted = mountTmpfs(size)
  if ('refused' in mounted) return null
  const { dir } = mounted
  // The mount's root is 1777 (sticky): a server's OS user must own it to use it as its directory.
  chmodSync(dir, 0o700)
  if (owner !== undefined) chownSync(dir, idOf('-u', owner), idOf('-g', owner))
  else chmodSync(dir, 0o755)
  const filler = join(dir, 'filler')
  let removed = false
  const remove = () => {
    if (removed) return
    removed = true
    process.off('exit', remove)
    Bun.spawnSync(['umount', '-l', dir])
    rmSync(dir, { recursive: true, force: true })
  }
  process.once('exit', remove)
  return {
    dir,
    fill: () => void Bun.spawnSync(['dd', 'if=/dev/zero', `of=${filler}`, 'bs=4k', 'status=none']),
    free: () => rmSync(filler, { force: true }),
    remove,
  }
}

function idOf(flag: '-u' | '-g', user: string): number {
  return Number(Bun.spawnSync(['id', flag, user]).stdout.toString())
}
