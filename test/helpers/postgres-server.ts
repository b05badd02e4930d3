/** A private PostgreSQL server for tests that restart or stop it, on a free port in a temporary directory. */
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export interface PostgresServer {
  port: number
  url: string
  /** `pg_ctl restart -m fast`: resolves once the server accepts connections again. */
  restart(): Promise<void>
  /** Stops the server (immediate mode) and removes its directory; safe to call twice. */
  stop(): Promise<void>
}

/** The directory holding `initdb` and `pg_ctl`: the PATH, else Debian's newest server; null without either. */
export function postgresBinaries(): string | null {
  const onPath = Bun.which('pg_ctl')
  if (onPath && Bun.which('initdb')) return join(onPath, '..')
  const root = '/usr/lib/postgresql'
  if (!existsSync(root)) return null
  const versions = readdirSync(root).filter(name => existsSync(join(root, name, 'bin', 'pg_ctl')))
  const newest = versions.sort((a, b) => Number(b) - Number(a))[0]
  return newest === undefined ? null : join(root, newest, 'bin')
}

/** initdb and start a server (trust auth, user postgres, fsync off) on a random free loopback port. */
export async function startPostgresServer(): Promise<PostgresServer> {
  const bin = postgresBinaries()
  if (bin === null) throw new Error('initdb and pg_ctl not found (apt-get install postgresql)')
  const dir = mkdtempSync(join(tmpdir(), 'am-pg-'))
  const data = join(dir, 'data')
  // PostgreSQL refuses to run as root: the server's files then belong to the postgres user.
  const asRoot = process.getuid?.() === 0
  if (asRoot) chownSync(dir, Number(await output(['id', '-u', 'postgres'])), Number(await output(['id', '-g', 'postgres'])))
  const run = (args: string[]) => output(asRoot ? ['su', 'postgres', '-c', args.map(quote).join(' ')] : args)

  let stopped = false
  const stop = async () => {
    if (stopped) return
    stopped = true
    if (existsSync(join(data, 'postmaster.pid'))) await run([join(bin, 'pg_ctl'), '-D', data, '-m', 'immediate', '-w', 'stop']).catch(() => {})
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    await run([join(bin, 'initdb'), '-D', data, '-U', 'postgres', '-A', 'trust', '--no-sync'])
    for (let attempt = 1; ; attempt++) {
      const port = await freePort()
      const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`
      const started = await run([join(bin, 'pg_ctl'), '-D', data, '-l', join(dir, 'log'), '-o', options, '-w', '-t', '30', 'start']).then(
        () => true,
        // Another process may take the port between the check and the server's bind.
        error => (attempt < 3 ? false : Promise.reject(error)),
      )
      if (!started) continue
      return {
        port,
        url: `postgres://postgres@127.0.0.1:${port}/postgres`,
        async restart() {
          await run([join(bin, 'pg_ctl'), '-D', data, '-l', join(dir, 'log'), '-o', options, '-m', 'fast', '-w', '-t', '30', 'restart'])
        },
        stop,
      }
    }
  } catch (error) {
    await stop()
    throw error
  }
}

async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve))
  const address = server.address()
  await new Promise(resolve => server.close(resolve))
  if (address === null || typeof address === 'string') throw new Error('no free port')
  return address.port
}

async function output(command: string[]): Promise<string> {
  const proc = Bun.spawn(command, { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  if (code !== 0) throw new Error(`${command.join(' ')} exited ${code}: ${stderr.trim() || stdout.trim()}`)
  return stdout.trim()
}

function quote(arg: string): string {
  return /^[\w./=:-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`
}
