/**
 * nginx in front of API processes, as a deployment runs it: an instance of the test's own (its own
 * config, prefix and port; never the system service) proxying to an upstream with a keep-alive
 * pool. Debian's nginx is installed with apt-get when it is missing (tests run as root here and in
 * CI), as the browser tests install Chromium.
 */
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { debianPackage } from './debian.ts'
import { freePort } from './ports.ts'

export const nginxPath = '/usr/sbin/nginx'

export interface Nginx {
  port: number
  url: string
  /** nginx's error log (upstream failures are logged there at `error`). */
  errorLog(): string
  stop(): Promise<void>
}

/** The settings docs/operations.md gives (Behind a reverse proxy): each upstream server's, and the `location`'s. */
export const documented = {
  server: 'max_fails=0',
  location: `
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_connect_timeout 2s;
      client_max_body_size 8m;`,
}

/** The path of nginx, installing the Debian package first if needed (its service is not started: there is no init here). */
export function nginx(): Promise<string> {
  return debianPackage('nginx', nginxPath)
}

/**
 * Starts nginx on a spare port in front of `upstreams` (ports on 127.0.0.1), one worker, with an
 * upstream keep-alive pool whose timeout is nginx's default (60 s), configured as documented unless
 * `server` (each upstream server's parameters) or `location` say otherwise. `cache`: a cache zone
 * named `api` (`proxy_cache_path`), for a `location` that uses it.
 */
export async function startNginx(upstreams: number[], options: { server?: string; location?: string; cache?: boolean } = {}): Promise<Nginx> {
  const binary = await nginx()
  const dir = mkdtempSync(join(tmpdir(), 'am-nginx-'))
  mkdirSync(join(dir, 'temp'))
  if (options.cache) {
    // nginx's workers (www-data, not root) write the cache's files.
    chmodSync(dir, 0o755)
    mkdirSync(join(dir, 'cache'))
    chmodSync(join(dir, 'cache'), 0o777)
  }
  const port = await freePort()
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map(name => `${name}_temp_path ${dir}/temp/${name};`).join(' ')
  writeFileSync(
    join(dir, 'nginx.conf'),
    `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log info;
events { worker_connections 1024; }
http {
  access_log off;
  ${temp}
  ${options.cache ? `proxy_cache_path ${dir}/cache keys_zone=api:1m;` : ''}
  upstream api {
    ${upstreams.map(upstream => `server 127.0.0.1:${upstream} ${options.server ?? documented.server};`).join('\n    ')}
    keepalive 64;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://api;
      ${options.location ?? documented.location}
    }
  }
}
`,
  )
  const proc: Subprocess = Bun.spawn([binary, '-p', dir, '-c', join(dir, 'nginx.conf')], { stdin: 'ignore', stdout: 'ignore', stderr: 'pipe' })
  const url = `http://127.0.0.1:${port}`
  const deadline = Date.now() + 10_000
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`nginx exited with ${proc.exitCode}: ${await new Response(proc.stderr as ReadableStream).text()}`)
    try {
      await fetch(`${url}/health/live`, { signal: AbortSignal.timeout(1000) })
      break
    } catch {
      if (Date.now() > deadline) throw new Error(`nginx did not answer on ${port} within 10 s`)
      await Bun.sleep(50)
    }
  }
  return {
    port,
    url,
    errorLog: () => readFileSync(join(dir, 'error.log'), 'utf8'),
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM')
      await proc.exited
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
