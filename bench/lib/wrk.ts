/** wrk, the bench's load generator: installed when missing, run pinned to its core with bench/wrk/requests.lua, its summary parsed. */
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { LoadResult } from './load.ts'
import { outDir, root } from './proc.ts'

const script = join(root, 'bench', 'wrk', 'requests.lua')
const taskset = Bun.which('taskset')

/** wrk's path; installs the Debian package (apt-get, as root) when it is missing. */
export function ensureWrk(progress: (line: string) => void): string {
  const found = Bun.which('wrk')
  if (found) return found
  const manual = 'Install it (Debian package `wrk`: `apt-get update && apt-get install -y wrk`) and run the bench again.'
  if (process.getuid?.() !== 0) throw new Error(`wrk, the bench's load generator, is not installed, and this is not root. ${manual}`)
  progress('wrk not found: installing the Debian package (apt-get update, apt-get install -y wrk)')
  for (const command of [
    ['apt-get', 'update'],
    ['apt-get', 'install', '-y', 'wrk'],
  ]) {
    const run = Bun.spawnSync(command, { env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, stdout: 'pipe', stderr: 'pipe' })
    if (run.exitCode !== 0) {
      const said = run.stderr.toString().trim().split('\n').slice(-3).join(' / ')
      throw new Error(`\`${command.join(' ')}\` failed with ${run.exitCode} (${said}). ${manual}`)
    }
  }
  const installed = Bun.which('wrk')
  if (!installed) throw new Error(`apt-get installed wrk, yet it is not on the PATH. ${manual}`)
  return installed
}

/** wrk's version line ("wrk 4.1.0 [epoll] ..."), for the report. */
export function wrkVersion(wrk: string): string {
  const run = Bun.spawnSync([wrk, '-v'], { stdout: 'pipe', stderr: 'pipe' })
  const text = run.stdout.toString() + run.stderr.toString()
  return /wrk (\S+)/.exec(text)?.[1] ?? 'unknown'
}

/** A file of request lines for the Lua script: an agent key each, and for replies a tab and the user id. */
export interface RequestLines {
  file: string
  count: number
}

export function writeLines(name: string, lines: string[]): RequestLines {
  const file = join(outDir, `${name}.lines`)
  writeFileSync(file, lines.join('\n') + '\n')
  return { file, count: lines.length }
}

/** What wrk sends: a path, GETs or replies, keys from `lines` taken at random or each once. */
export interface Requests {
  path: string
  kind: 'get' | 'reply'
  lines: RequestLines
  order: 'random' | 'once'
  /** Order "once": the first line to take (0-based). */
  first?: number
  /** Count responses by status (wrk then parses each response, which costs the generator). */
  statuses?: boolean
}

export interface WrkOptions {
  wrk: string
  url: string
  requests: Requests
  connections: number
  threads: number
  seconds: number
  /** The core wrk is pinned to (taskset), if any. */
  cpu?: number
}

/** Order "once": which lines the run took. */
export interface Taken {
  taken: number
  /** The first line no thread reached: where the next run starts. */
  next: number
  exhausted: boolean
}

interface Summary {
  requests: number
  durationUs: number
  errors: { connect: number; read: number; write: number; status: number; timeout: number }
  latencyUs: { max: number; p50: number; p99: number }
  quantiles: [number, number][]
  statuses: Record<string, number>
  taken: number
  next: number
  exhausted: boolean
}

/** One wrk run: the load it measured and, for order "once", the lines it took. */
export async function runWrk(options: WrkOptions): Promise<{ load: LoadResult; taken: Taken }> {
  const { requests: r } = options
  const pin = taskset && options.cpu !== undefined ? [taskset, '-c', String(options.cpu)] : []
  const command = [
    ...pin,
    options.wrk,
    `--threads=${options.threads}`,
    `--connections=${options.connections}`,
    `--duration=${options.seconds}s`,
    // A request unanswered this long counts as a timeout; wrk keeps a 1 µs histogram up to it.
    '--timeout=10s',
    `--script=${script}`,
    options.url,
    '--',
    r.lines.file,
    r.order,
    String(r.first ?? 0),
    String(options.threads),
    r.kind,
    r.path,
    r.statuses ? '1' : '0',
  ]
  const proc = Bun.spawn(command, { stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  const line = stdout.split('\n').find(l => l.startsWith('wrk-json '))
  if (code !== 0 || !line) throw new Error(`wrk exited with ${code} and no summary: ${stderr.trim() || stdout.trim()}`)
  const s = JSON.parse(line.slice('wrk-json '.length)) as Summary
  const usage = proc.resourceUsage()
  const seconds = s.durationUs / 1e6
  const load: LoadResult = {
    requests: s.requests,
    seconds,
    rps: s.requests / seconds,
    p50: s.latencyUs.p50 / 1000,
    p99: s.latencyUs.p99 / 1000,
    max: s.latencyUs.max / 1000,
    statuses: r.statuses ? s.statuses : undefined,
    failed: s.errors.status,
    socketErrors: s.errors.connect + s.errors.read + s.errors.write + s.errors.timeout,
    quantiles: s.quantiles.map(([percent, us]) => [percent, us / 1000]),
    generatorCpuSeconds: usage ? Number(usage.cpuTime.user + usage.cpuTime.system) / 1e6 : 0,
  }
  return { load, taken: { taken: s.taken, next: s.next, exhausted: s.exhausted } }
}
