/**
 * Servers reached as managed ones are: TLS only, with a certificate of a private CA (made here with
 * openssl) and users with passwords. A PostgreSQL of the test's own turned TLS-only (`hostssl` in
 * pg_hba.conf, plain TCP refused), and a redis-server with no plain port and ACL users.
 */
import { chownSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { createSql } from '../../src/db.ts'
import { freePort } from './ports.ts'
import type { PostgresServer } from './postgres-server.ts'

export interface Certificates {
  dir: string
  /** The CA that signed the servers' certificate (for `localhost` and 127.0.0.1), a PEM file. */
  caFile: string
  /** Another CA, which signed nothing the servers show. */
  otherCaFile: string
  certFile: string
  keyFile: string
  remove(): void
}

/** A CA, a server certificate it signed, and another CA; null without openssl. */
export function makeCertificates(): Certificates | null {
  if (Bun.which('openssl') === null) return null
  const dir = mkdtempSync(join(tmpdir(), 'am-tls-'))
  const file = (name: string) => join(dir, name)
  const openssl = (...args: string[]) => {
    const run = Bun.spawnSync(['openssl', ...args], { cwd: dir, stdout: 'pipe', stderr: 'pipe' })
    if (run.exitCode !== 0) throw new Error(`openssl ${args[0]} exited ${run.exitCode}: ${run.stderr.toString()}`)
  }
  const ca = (name: string) =>
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', `/CN=${name}`, '-keyout', `${name}.key`, '-out', `${name}.crt`)
  ca('test-ca')
  ca('other-ca')
  openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=localhost', '-keyout', 'server.key', '-out', 'server.csr')
  writeFileSync(file('san.cnf'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n')
  openssl(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'test-ca.crt',
    '-CAkey',
    'test-ca.key',
    '-CAcreateserial',
    '-days',
    '2',
    '-extfile',
    'san.cnf',
    '-out',
    'server.crt',
  )
  return {
    dir,
    caFile: file('test-ca.crt'),
    otherCaFile: file('other-ca.crt'),
    certFile: file('server.crt'),
    keyFile: file('server.key'),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  }
}

/**
 * Turns `server` TLS-only: its certificate from `certs`, every TCP connection over TLS (`hostssl`),
 * `postgres` trusted there and every other role by password (SCRAM). Reloaded, not restarted.
 */
export async function requireTls(server: PostgresServer, certs: Certificates): Promise<void> {
  const admin = createSql(server.url(), { max: 1 })
  try {
    const [row] = await admin<{ data: string; hba: string }[]>`
      select current_setting('data_directory') as data, current_setting('hba_file') as hba
    `
    const { data, hba } = row!
    // The server reads its key only if its own user owns it and no one else may read it.
    const owner = statSync(data)
    for (const [from, to] of [
      [certs.certFile, 'server.crt'],
      [certs.keyFile, 'server.key'],
    ] as const) {
      writeFileSync(join(data, to), await Bun.file(from).text(), { mode: 0o600 })
      chownSync(join(data, to), owner.uid, owner.gid)
    }
    writeFileSync(
      hba,
      ['local all all trust', 'hostssl all postgres 127.0.0.1/32 trust', 'hostssl all all 127.0.0.1/32 scram-sha-256', ''].join('\n'),
    )
    await admin`alter system set ssl = on`
    await admin`select pg_reload_conf()`
  } finally {
    await admin.end({ timeout: 1 })
  }
}

export interface TlsRedis {
  port: number
  /** An admin connection (every command), trusting the test CA. */
  admin(): Redis
  output(): string
  close(): Promise<void>
}

/**
 * A redis-server with a TLS port only (clients not asked for certificates), its default user off,
 * `admin` allowed everything and `users` as given (`name`, then ACL rules such as `>password ~keys* +@all`).
 * Null when this redis-server was built without TLS.
 */
export async function startTlsRedis(certs: Certificates, users: Record<string, string[]>): Promise<TlsRedis | null> {
  const port = await freePort()
  const adminPassword = crypto.randomUUID()
  const acl = Object.entries({ ...users, admin: [`>${adminPassword}`, '~*', '&*', '+@all'] }).flatMap(([name, rules]) => [
    '--user',
    name,
    'on',
    ...rules,
  ])
  const args = ['--port', '0', '--tls-port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']
  const tls = ['--tls-cert-file', certs.certFile, '--tls-key-file', certs.keyFile, '--tls-ca-cert-file', certs.caFile, '--tls-auth-clients', 'no']
  const proc = Bun.spawn(['redis-server', ...args, ...tls, '--user', 'default', 'off', ...acl], { stdin: 'ignore', stdout: 'pipe', stderr: 'pipe' })
  let log = ''
  const keep = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream) log = (log + new TextDecoder().decode(chunk)).slice(-20_000)
  }
  void keep(proc.stdout)
  void keep(proc.stderr)
  const onExit = () => proc.kill('SIGKILL')
  process.once('exit', onExit)
  const ca = await Bun.file(certs.caFile).text()
  const admin = () =>
    new Redis({ host: '127.0.0.1', port, username: 'admin', password: adminPassword, tls: { ca }, lazyConnect: true, retryStrategy: () => null })
  const close = async () => {
    proc.kill('SIGKILL')
    await proc.exited
    process.off('exit', onExit)
  }
  const deadline = Date.now() + 15_000
  for (;;) {
    if (proc.exitCode !== null) {
      await close()
      // A build without TLS refuses the tls-* settings.
      if (/tls/i.test(log)) return null
      throw new Error(`redis-server exited with ${proc.exitCode}: ${log.slice(-2000)}`)
    }
    const probe = admin()
    probe.on('error', () => {})
    const answered = await probe
      .connect()
      .then(() => probe.ping())
      .then(
        () => true,
        () => false,
      )
    probe.disconnect()
    if (answered) break
    if (Date.now() > deadline) {
      await close()
      throw new Error(`redis-server with TLS on port ${port} did not answer within 15 s: ${log.slice(-2000)}`)
    }
    await Bun.sleep(50)
  }
  return { port, admin, output: () => log, close }
}
