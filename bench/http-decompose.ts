/**
 * `bun bench/http-decompose.ts`: where a poll's CPU goes over HTTP. The bare route, then the same
 * handler inside the app (every global hook), the app's `/health/live`, the bare handler behind the
 * agent's authentication, and the poll, each under wrk, in short alternating rounds.
 */
// Options: --agents (10,000), --rounds (20), --seconds (1 a round). The servers run pinned to core 1
// and wrk to core 0, as in bench/run.ts. A server's CPU is read from /proc/<pid>/schedstat (ns); a
// round where it had less than 90 % of its core (the host busy with something else) is left out of
// the medians. Each configuration is also compared with the bare route round by round (the same
// minute of the host), which is the figure to go by on a shared machine.
import { readFileSync } from 'node:fs'
import { parseArgs } from 'node:util'
import { pinSelf, spawnBun, waitHealthy, type Server } from './lib/proc.ts'
import { seedAgents } from './lib/seed-agents.ts'
import { percentile } from './lib/stats.ts'
import { createWorld } from './lib/world.ts'
import { ensureWrk, runWrk, writeLines, type Requests } from './lib/wrk.ts'
import { warmAgents } from './scenarios/agent-poll.ts'
import { createSql } from '../src/db.ts'
import { migrate } from '../src/migrate.ts'

const { values } = parseArgs({
  args: Bun.argv.slice(2),
  options: { agents: { type: 'string', default: '10000' }, rounds: { type: 'string', default: '20' }, seconds: { type: 'string', default: '1' } },
})
const agentCount = Number(values.agents)
const rounds = Number(values.rounds)
const seconds = Number(values.seconds)

const cpuSeconds = (pid: number) => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e9
const median = (xs: number[]) => percentile(Float64Array.from(xs).sort(), 0.5)

const wrk = ensureWrk(console.log)
const pinned = pinSelf(0)
const world = await createWorld()
const servers: Server[] = []
try {
  const migrator = createSql(world.databaseUrl, { max: 1 })
  await migrate(migrator)
  await migrator.end()
  const agents = await seedAgents(world.sql, { agents: agentCount, pendingEvery: 100, repliers: 0 })
  const lines = writeLines(
    'decompose-keys',
    agents.map(agent => agent.key),
  )
  const start = async (name: string, script: string, port: number, healthPath: string) => {
    const server = spawnBun(name, [script], { ...world.env, PORT: String(port) }, { cpu: 1, port })
    servers.push(server)
    await waitHealthy(server, healthPath)
    return server
  }
  const bare = await start('decompose-bare', 'bench/baseline-server.ts', 3110, '/')
  const app = await start('decompose-app', 'bench/probe-server.ts', 3111, '/health/live')
  // Every key cached and every inbox built, as in the bench's poll scenario.
  await warmAgents(app, agents, 64, false)
  const targets: { name: string; server: Server; path: string }[] = [
    { name: 'bare route (bench/baseline-server.ts)', server: bare, path: '/' },
    { name: 'the same handler in the app', server: app, path: '/probe/bare' },
    { name: 'the app’s GET /health/live', server: app, path: '/health/live' },
    { name: 'the same handler behind { agent: true }', server: app, path: '/probe/agent' },
    { name: 'the poll, GET /v1/agent/events', server: app, path: '/v1/agent/events' },
  ]
  const requests = (path: string): Requests => ({ path, kind: 'get', lines, order: 'random' })
  const load = (target: (typeof targets)[number], s: number) =>
    runWrk({ wrk, url: target.server.url, requests: requests(target.path), connections: 64, threads: 1, seconds: s, cpu: pinned ? 0 : undefined })
  for (const target of targets) await load(target, 2)

  const runs = targets.map(() => [] as { us: number; rps: number; p99: number; share: number }[])
  for (let round = 0; round < rounds; round++) {
    for (const [i, target] of targets.entries()) {
      const before = cpuSeconds(target.server.pid)
      const { load: result } = await load(target, seconds)
      const used = cpuSeconds(target.server.pid) - before
      if (result.failed + result.socketErrors > 0) throw new Error(`${target.path}: ${result.failed + result.socketErrors} failed requests`)
      runs[i]!.push({ us: (used * 1e6) / result.requests, rps: result.rps, p99: result.p99, share: used / result.seconds })
    }
    process.stdout.write(`\rround ${round + 1} of ${rounds}`)
  }
  console.log(
    `\n\n${agentCount.toLocaleString('en-US')} agents; ${rounds} rounds of ${seconds} s; wrk: 1 thread, 64 connections${pinned ? '; servers on core 1, wrk on core 0' : ''}\n`,
  )
  console.log('| configuration | CPU µs a request (median, p25) | req/s | p99 ms | minus the bare route, same round (median) | rounds kept |')
  console.log('|---|--:|--:|--:|--:|--:|')
  for (const [i, target] of targets.entries()) {
    const kept = runs[i]!.filter(run => run.share >= 0.9)
    const rows = kept.length > 0 ? kept : runs[i]!
    const us = Float64Array.from(rows.map(run => run.us)).sort()
    const paired = runs[i]!.map((run, round) => run.us - runs[0]![round]!.us)
    console.log(
      `| ${target.name} | ${median(rows.map(run => run.us)).toFixed(1)}, ${percentile(us, 0.25).toFixed(1)} | ${Math.round(median(rows.map(run => run.rps))).toLocaleString('en-US')} | ${median(rows.map(run => run.p99)).toFixed(2)} | ${i === 0 ? '–' : `${median(paired) >= 0 ? '+' : ''}${median(paired).toFixed(1)}`} | ${kept.length}/${rounds} |`,
    )
  }
} finally {
  for (const server of servers) await server.stop()
  await world.destroy()
}
