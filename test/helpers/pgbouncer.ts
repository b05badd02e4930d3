/**
 * PgBouncer in front of a PostgreSQL server, as docs/operations.md (Behind PgBouncer) configures it:
 * an instance of the test's own (its own config and a spare port; never the system service), every
 * database of the server passed through, logged in as one user of the server. Debian's package is
 * installed with apt-get when it is missing, as nginx is.
 */
import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { connect } from 'node:net'
import { debianPackage } from './debian.ts'
import { freePort } from './ports.ts'

export const pgbouncerPath = '/usr/sbin/pgbouncer'

/** What docs/operations.md says to ignore: the startup parameters the service sends that PgBouncer does not track. */
export const documentedIgnored = 'enable_seqscan,jit,statement_timeout,lock_timeout,default_transaction_isolation'

export interface PgBouncer {
  port: number
  /** The URL of `database` through it; `?prepare=false` in transaction mode (1.18 has no `max_prepared_statements`). */
  url(database: string): string
  stop(): Promise<void>
}

/** Starts PgBouncer on a spare port of 127.0.0.1 in front of the server on `serverPort` (trust auth), in `poolMode`, logging in as `user`. */
export async function startPgBouncer(serverPort: number, poolMode: 'session' | 'transaction', user = 'postgres'): Promise<PgBouncer> {
  const binary = await debianPackage('pgbouncer', pgbouncerPath)
  const dir = mkdtempSync(join(tmpdir(), 'am-pgbouncer-'))
  const port = await freePort()
  // auth_type any: whatever user the client names, PgBouncer logs in as `user`. It refuses to run as root.
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    `[databases]
* = host=127.0.0.1 port=${serverPort} user=${user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = any
pool_mode = ${poolMode}
ignore_startup_parameters = ${documentedIgnored}
logfile = ${dir}/pgbouncer.log
`,
  )
  const asRoot = process.getuid?.() === 0
  if (asRoot)
    chownSync(
      dir,
      Number(Bun.spawnSync(['id', '-u', 'postgres']).stdout.toString()),
      Number(Bun.spawnSync(['id', '-g', 'postgres']).stdout.toString()),
    )
  const proc: Subprocess = Bun.spawn([binary, ...(asRoot ? ['-u', 'postgres'] : []), join(dir, 'pgbouncer.ini')], {
    stdin: 'ignore',
    stdout: 'ignore',
    stderr: 'pipe',
  })
  const deadline = Date.now() + 10_000
  while (!(await listening(port))) {
    if (proc.exitCode !== null) throw new Error(`pgbouncer exited with ${proc.exitCode}: ${await new Response(proc.stderr as ReadableStream).text()}`)
    if (Date.now() > deadline) throw new Error(`pgbouncer did not listen on ${port} within 10 s`)
    await Bun.sleep(50)
  }
  return {
    port,
    url: database => `postgres://${user}@127.0.0.1:${port}/${database}${poolMode === 'transaction' ? '?prepare=false' : ''}`,
    async stop() {
      // SIGINT: from 1.23 on, SIGTERM waits for every client to leave.
      if (proc.exitCode === null) proc.kill('SIGINT')
      await proc.exited
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

function listening(port: number): Promise<boolean> {
  return new Promise(resolve => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => resolve(true))
    socket.once('error', () => resolve(false))
    socket.once('connect', () => socket.destroy())
  })
}
