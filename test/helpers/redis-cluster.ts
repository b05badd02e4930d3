/**
 * A Redis Cluster of a test's own: three masters (`redis-server --cluster-enabled yes`) as children
 * on spare ports, joined by `redis-cli --cluster create`, their files in a temporary directory.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Cluster } from 'ioredis'
import { freePort } from './ports.ts'
import { until } from './until.ts'

export interface RedisCluster {
  ports: number[]
  /** A cluster client of ioredis, closed with the cluster. */
  client(): Promise<Cluster>
  close(): Promise<void>
}

export async function startRedisCluster(masters = 3): Promise<RedisCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'am-redis-cluster-'))
  const ports: number[] = []
  while (ports.length < masters) ports.push(await clusterPort())
  const procs = ports.map(port =>
    Bun.spawn(
      [
        'redis-server',
        ...['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no'],
        ...['--cluster-enabled', 'yes', '--cluster-config-file', `nodes-${port}.conf`, '--daemonize', 'no', '--logfile', ''],
      ],
      { stdin: 'ignore', stdout: 'ignore', stderr: 'ignore' },
    ),
  )
  const clients: Cluster[] = []
  const close = async () => {
    for (const client of clients) client.disconnect()
    for (const proc of procs) proc.kill('SIGKILL')
    await Promise.all(procs.map(proc => proc.exited))
    rmSync(dir, { recursive: true, force: true })
    process.off('exit', onExit)
  }
  // The last resort when the test process ends without closing it (a failure, Ctrl-C).
  const onExit = () => {
    for (const proc of procs) proc.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
  process.once('exit', onExit)
  try {
    await until(async () => (await Promise.all(ports.map(answers))).every(Boolean), 15_000)
    const create = Bun.spawn(['redis-cli', '--cluster', 'create', ...ports.map(p => `127.0.0.1:${p}`), '--cluster-replicas', '0', '--cluster-yes'], {
      stdout: 'pipe',
      stderr: 'pipe',
    })
    if ((await create.exited) !== 0) throw new Error(`redis-cli --cluster create failed: ${await new Response(create.stdout).text()}`)
    await until(async () => (await Promise.all(ports.map(clusterOk))).every(Boolean), 15_000)
  } catch (error) {
    await close()
    throw error
  }
  return {
    ports,
    async client() {
      const client = new Cluster(
        ports.map(port => ({ host: '127.0.0.1', port })),
        { lazyConnect: false },
      )
      clients.push(client)
      await new Promise<void>((resolve, reject) => {
        client.once('ready', resolve)
        client.once('error', reject)
      })
      // Later errors come back on the calls that meet them; unheard, one would end the test process.
      client.on('error', () => {})
      return client
    },
    close,
  }
}

/** A spare port whose cluster bus port (10,000 above it) is spare too. */
async function clusterPort(): Promise<number> {
  for (;;) {
    const port = await freePort()
    if (port + 10_000 < 65_536 && (await isFree(port + 10_000))) return port
  }
}

function isFree(port: number): Promise<boolean> {
  const server = createServer()
  return new Promise(resolve => {
    server.once('error', () => resolve(false))
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)))
  })
}

async function cli(port: number, ...args: string[]): Promise<string> {
  const proc = Bun.spawn(['redis-cli', '-p', String(port), ...args], { stdout: 'pipe', stderr: 'ignore' })
  const out = await new Response(proc.stdout).text()
  await proc.exited
  return out
}

const answers = async (port: number) => (await cli(port, 'ping')).trim() === 'PONG'
const clusterOk = async (port: number) => (await cli(port, 'cluster', 'info')).includes('cluster_state:ok')
