import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { deleteKeys, randomPrefix } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import {
  deploymentEnv,
  descendants,
  exitOnSecondSigterm,
  exitWithin,
  isRunning,
  processGroup,
  projectRoot,
  type Started,
} from './helpers/processes.ts'
import { freePort } from './helpers/ports.ts'

// What a container runtime or a process manager does: start `npm start`, later send SIGTERM to the
// process it started (npm), and expect everything under it gone, ports (the metrics' too) and all.

const root = mkdtempSync(join(tmpdir(), 'am-npm-start-'))
const { start, killAll } = processGroup()
const databases: TestDatabase[] = []
const prefixes: string[] = []
const seen = new Set<number>()

afterAll(async () => {
  await killAll()
  // A failed test may leave what npm started running on its own: end it too.
  for (const pid of seen) if (isRunning(pid)) process.kill(pid, 'SIGKILL')
  await Promise.all(databases.map(database => database.drop()))
  await Promise.all(prefixes.map(prefix => deleteKeys(prefix)))
  rmSync(root, { recursive: true, force: true })
})

function environment(port: number, databaseUrl: string | undefined, extra: Record<string, string> = {}): Record<string, string> {
  const prefix = randomPrefix()
  prefixes.push(prefix)
  return deploymentEnv(root, prefix, { PORT: String(port), DATABASE_URL: databaseUrl, ...extra })
}

async function waitForReady(port: number, started: Started, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (started.proc.exitCode !== null) throw new Error(`npm start exited with ${started.proc.exitCode}: ${await started.stderr}`)
    const status = await fetch(`http://127.0.0.1:${port}/health`).then(
      response => response.status,
      () => 0,
    )
    if (status === 200) return
    await Bun.sleep(100)
  }
  throw new Error(`npm start did not answer on port ${port} within ${ms} ms`)
}

/** Whether nothing listens on the port any more: binding it succeeds. */
function isFree(port: number): boolean {
  try {
    Bun.listen({ hostname: '0.0.0.0', port, socket: { data() {} } }).stop(true)
    return true
  } catch {
    return false
  }
}

/**
 * The tree's PostgreSQL servers: its `postgres -D` processes but those forked by one (a backend just
 * forked still shows its parent's command line until it sets its own title).
 */
const postmasters = (tree: ReturnType<typeof descendants>) => {
  const servers = tree.filter(({ command }) => /\bpostgres -D /.test(command))
  return servers.filter(({ parent }) => !servers.some(({ pid }) => pid === parent))
}

/** The port a `postgres -D dir -p port` command line names. */
function postgresPort(command: string): number {
  return Number(command.match(/ -p (\d+)/)?.[1])
}

/** Starts `npm start`, waits for it, signals npm alone, and checks that the whole tree is gone. */
async function startAndTerminate(databaseUrl: string | undefined, readyWithinMs: number) {
  const [port, metricsPort] = [await freePort(), await freePort()]
  const npm = start(['start'], environment(port, databaseUrl, { METRICS_PORT: String(metricsPort) }), ['npm'])
  await waitForReady(port, npm, readyWithinMs)
  const metrics = await fetch(`http://127.0.0.1:${metricsPort}/metrics`)
  expect(metrics.status).toBe(200)
  expect(await metrics.text()).toContain('http_request_duration_seconds_count{route="/health",method="GET",status="200"}')
  const tree = descendants(npm.proc.pid)
  for (const { pid } of tree) seen.add(pid)
  expect(tree.some(({ command }) => command.includes('src/main.ts'))).toBe(true)

  npm.proc.kill('SIGTERM')
  expect(await exitWithin(npm.proc, 20_000)).toBe(0)
  expect(tree.filter(({ pid }) => isRunning(pid))).toEqual([])
  expect(isFree(port)).toBe(true)
  expect(isFree(metricsPort)).toBe(true)
  return { tree, stdout: await npm.stdout }
}

describe('the service started through npm start', () => {
  test('SIGTERM to npm drains the service and exits 0, leaving no process and no open port', async () => {
    const database = await createTestDatabase()
    databases.push(database)
    await startAndTerminate(database.url, 20_000)
  }, 40_000)

  test('SIGTERM to npm’s whole process group (systemd’s default KillMode) drains once and exits 0, though Bun gets it twice', async () => {
    const database = await createTestDatabase()
    databases.push(database)
    const port = await freePort()
    // A group of its own, as a service manager gives it: npm leads it.
    const npm = start(['npm', 'start'], environment(port, database.url, { SHUTDOWN_DELAY_MS: '500', LOG_LEVEL: 'info' }), ['setsid'])
    await waitForReady(port, npm, 20_000)
    const tree = descendants(npm.proc.pid)
    for (const { pid } of tree) seen.add(pid)
    process.kill(-npm.proc.pid, 'SIGTERM')
    expect(await exitWithin(npm.proc, 20_000)).toBe(0)
    const stdout = await npm.stdout
    expect(stdout).not.toContain('while shutting down')
    expect(stdout).toContain('"msg":"stopped"')
    expect(tree.filter(({ pid }) => isRunning(pid))).toEqual([])
  }, 40_000)

  test('with the embedded PostgreSQL, SIGTERM to npm stops the database too', async () => {
    const { tree } = await startAndTerminate(undefined, 60_000)
    const postgres = postmasters(tree)
    expect(postgres).toHaveLength(1)
    expect(isFree(postgresPort(postgres[0]!.command))).toBe(true)
  }, 90_000)

  test('with the embedded PostgreSQL, SIGHUP to Bun (a closed terminal) drains as SIGTERM does and stops the database', async () => {
    const port = await freePort()
    const npm = start(['start'], environment(port, undefined, { LOG_LEVEL: 'info' }), ['npm'])
    await waitForReady(port, npm, 60_000)
    const tree = descendants(npm.proc.pid)
    for (const { pid } of tree) seen.add(pid)
    const bun = tree.find(({ command }) => command.includes('src/main.ts'))!
    const postgres = postmasters(tree)
    expect(postgres).toHaveLength(1)
    // npm passes on only SIGTERM and SIGINT; a terminal's hangup reaches every process of its group.
    process.kill(bun.pid, 'SIGHUP')
    expect(await exitWithin(npm.proc, 20_000)).toBe(0)
    expect(await npm.stdout).toContain('"msg":"shutting down","signal":"SIGHUP"')
    expect(tree.filter(({ pid }) => isRunning(pid))).toEqual([])
    expect(isFree(postgresPort(postgres[0]!.command))).toBe(true)
  }, 90_000)

  test('with the embedded PostgreSQL, SIGTERM during the boot stops the database before exiting', async () => {
    const port = await freePort()
    const npm = Bun.spawn(['npm', 'start'], {
      cwd: projectRoot,
      env: environment(port, undefined, { LOG_LEVEL: 'info' }),
      stdout: 'pipe',
      stderr: 'pipe',
    })
    seen.add(npm.pid)
    let out = ''
    const reader = npm.stdout.getReader()
    // The database is up; migrations and the rest of the boot follow, before the drain is ready.
    while (!out.includes('"msg":"embedded postgres started"')) {
      const { value, done } = await reader.read()
      if (done) throw new Error(`npm start ended before its database started: ${out}`)
      out += new TextDecoder().decode(value)
    }
    // At once, so that the boot is still under way (its database, stopping, fails what it runs).
    npm.kill('SIGTERM')
    const tree = descendants(npm.pid)
    for (const { pid } of tree) seen.add(pid)
    const databasePort = Number(out.match(/"msg":"embedded postgres started","port":(\d+)/)![1])
    // A stop asked for and done: 0, as a drain's, so a service manager does not call it a failure.
    expect(await exitWithin(npm, 10_000)).toBe(0)
    expect(tree.filter(({ pid }) => isRunning(pid))).toEqual([])
    expect(isFree(databasePort)).toBe(true)
    // A stop asked for, not a failed boot: what the stopped database then failed is not reported as one.
    expect(await new Response(npm.stderr).text()).toBe('')
  }, 90_000)

  test('with the embedded PostgreSQL, a second SIGTERM cuts the drain short and still stops the database', async () => {
    const port = await freePort()
    const npm = start(['start'], environment(port, undefined, { SHUTDOWN_TIMEOUT_MS: '60000' }), ['npm'])
    await waitForReady(port, npm, 60_000)
    const tree = descendants(npm.proc.pid)
    for (const { pid } of tree) seen.add(pid)
    const postgres = postmasters(tree)
    expect(postgres).toHaveLength(1)
    expect(await exitOnSecondSigterm(npm.proc, port, 10_000)).toBe(1)
    expect(tree.filter(({ pid }) => isRunning(pid))).toEqual([])
    expect(isFree(postgresPort(postgres[0]!.command))).toBe(true)
  }, 90_000)
})
