/**
 * HAProxy in front of API processes, as a deployment runs it: an instance of the test's own (its own
 * config and port; never the system service), configured as docs/operations.md gives unless a test
 * says otherwise. Debian's haproxy is installed with apt-get when it is missing, as nginx is.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { debianPackage } from './debian.ts'
import { freePort } from './ports.ts'

export const haproxyPath = '/usr/sbin/haproxy'

export interface Haproxy {
  port: number
  url: string
  /** What HAProxy wrote: its warnings (servers going up and down) and a line per request (`option httplog`). */
  log(): string
  /** Each server's changes of state so far, in order: `api0 DOWN Layer7 wrong status, code: 503`, `api0 UP ...`. */
  serverChanges(): string[]
  stop(): Promise<void>
}

/**
 * The settings docs/operations.md gives (Behind a reverse proxy, HAProxy): its global, defaults and
 * backend sections' lines, with `option httplog` added for the tests to read what was answered.
 */
export const documented = {
  global: `
    tune.bufsize 32768`,
  defaults: `
    mode http
    option httplog
    option forwardfor
    option redispatch
    retries 3
    timeout connect 2s
    timeout client 30s
    timeout server 60s
    http-error status 503 content-type application/json string '{"success":false,"statusCode":503,"error":"unavailable","message":"No API process is available; try again"}' hdr retry-after 1`,
  backend: `
    option httpchk GET /health/ready
    http-check expect status 200
    default-server check inter 1s fall 2 rise 2`,
}

/** The path of haproxy, installing the Debian package first if needed (its service is not started: there is no init here). */
export function haproxy(): Promise<string> {
  return debianPackage('haproxy', haproxyPath)
}

/**
 * Starts HAProxy on a spare port in front of `upstreams` (ports on 127.0.0.1, servers `api0`,
 * `api1`, ...), configured as documented unless `global`, `defaults` or `backend` say otherwise;
 * resolves once it answers.
 */
export async function startHaproxy(upstreams: number[], options: { global?: string; defaults?: string; backend?: string } = {}): Promise<Haproxy> {
  const binary = await haproxy()
  const dir = mkdtempSync(join(tmpdir(), 'am-haproxy-'))
  const port = await freePort()
  const logPath = join(dir, 'haproxy.log')
  writeFileSync(
    join(dir, 'haproxy.cfg'),
    `
global
    log stderr format raw local0 info
    ${options.global ?? documented.global}
defaults
    log global
    ${options.defaults ?? documented.defaults}
frontend api
    bind 127.0.0.1:${port}
    default_backend api
backend api
    ${options.backend ?? documented.backend}
    ${upstreams.map((upstream, index) => `server api${index} 127.0.0.1:${upstream}`).join('\n    ')}
`,
  )
  // -db: in the foreground, its warnings and log on stderr, kept in a file (a pipe nobody read would fill).
  const proc: Subprocess = Bun.spawn([binary, '-db', '-f', join(dir, 'haproxy.cfg')], {
    stdin: 'ignore',
    stdout: 'ignore',
    stderr: Bun.file(logPath),
  })
  const url = `http://127.0.0.1:${port}`
  const log = () => readFileSync(logPath, 'utf8')
  const stop = async () => {
    if (proc.exitCode === null) proc.kill('SIGTERM')
    await proc.exited
    rmSync(dir, { recursive: true, force: true })
  }
  const fail = async (why: string) => {
    const text = log()
    await stop()
    return new Error(`haproxy ${why}: ${text}`)
  }
  const deadline = Date.now() + 10_000
  for (;;) {
    if (proc.exitCode !== null) throw await fail(`exited with ${proc.exitCode}`)
    const status = await fetch(`${url}/health/live`, { signal: AbortSignal.timeout(1000) }).then(
      response => response.status,
      () => 0,
    )
    if (status === 200) break
    if (Date.now() > deadline) throw await fail(`did not answer 200 on ${port} within 10 s`)
    await Bun.sleep(50)
  }
  return {
    port,
    url,
    log,
    serverChanges: () =>
      [...log().matchAll(/^\[WARNING\].*Server api\/(\S+) is (UP|DOWN), reason: ([^,]+(?:, code: \d+)?)/gm)].map(m => `${m[1]} ${m[2]} ${m[3]}`),
    stop,
  }
}
