/** `bun run bench`: a fresh database and Redis prefix, the bare route and the service under wrk's load, five scenarios, bench/RESULTS.md. */
// Options (bench/README.md): --only, --seconds, --rounds, --warm, --connections, --threads, --agents,
// --streams, --periods, --scale, --poll-sizes, --stream-sizes, --period-sizes, --profile poll|reply,
// --metrics.
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { loadavg } from 'node:os'
import { join } from 'node:path'
import { non2xx } from './lib/load.ts'
import { describeMachine } from './lib/machine.ts'
import type { Bench } from './lib/measure.ts'
import { parseOptions } from './lib/options.ts'
import { openFilesLimit, outDir, pinSelf, raiseOpenFiles, root, spawnBun, waitHealthy, type Server } from './lib/proc.ts'
import { renderResults, targets, type Results } from './lib/report.ts'
import { seedAgents, type SeededAgent } from './lib/seed-agents.ts'
import { createWorld, type World } from './lib/world.ts'
import { ensureWrk, writeLines, wrkVersion } from './lib/wrk.ts'
import type { LoadRun, ReplyRun, StreamsRun } from './lib/types.ts'
import { baselineScenario, startBaseline } from './scenarios/baseline.ts'
import { agentPollScenario, warmAgents } from './scenarios/agent-poll.ts'
import { prepareWaiting, replyScenario } from './scenarios/reply.ts'
import { streamsScenario } from './scenarios/streams.ts'
import { invoiceScenario } from './scenarios/invoices.ts'

const options = parseOptions(Bun.argv.slice(2))
const { only, profile, settings, sizes } = options
// --metrics: the API times every request, as where /metrics is served (issue 27: its cost a request).
const metricsEnv: Record<string, string> = options.metrics ? { METRICS_TOKEN: 'bench-metrics-token-of-at-least-32-chars' } : {}
const ports = { baseline: 3100, api: 3101 }
const begun = performance.now()
const cpuProfile = (name: string) => ['--cpu-prof-md', `--cpu-prof-dir=${outDir}`, `--cpu-prof-name=${name}.md`]
const progress = (line: string) => console.log(`[${((performance.now() - begun) / 1000).toFixed(0).padStart(4)} s] ${line}`)
const describe = (run: LoadRun) =>
  `${Math.round(run.load.rps)} req/s, p50 ${run.load.p50.toFixed(2)} ms, p99 ${run.load.p99.toFixed(2)} ms, ${run.server} CPU ${(
    (run.cpuSeconds[run.server]! * 1e6) /
    run.load.requests
  ).toFixed(
    1,
  )} µs a request, wrk ${(run.load.generatorCpuSeconds / run.wallSeconds).toFixed(2)} cores, non-2xx ${non2xx(run.load)}${run.load.statuses ? ` ${JSON.stringify(run.load.statuses)}` : ''}, load ${run.loadavg[1].toFixed(2)}`
const perReply = ({ perReply: c }: ReplyRun) =>
  progress(
    `  per reply: CPU µs API ${c.apiUs.toFixed(0)}, workers ${c.workersUs.toFixed(0)}, Postgres ${c.postgresUs.toFixed(0)}, Redis ${c.redisUs.toFixed(0)}, all ${(c.apiUs + c.workersUs + c.postgresUs + c.redisUs).toFixed(0)}; ${c.redisCommands.toFixed(1)} Redis commands, ${c.pgTransactions.toFixed(2)} Postgres transactions`,
  )

const wrk = ensureWrk(progress)
const pinned = pinSelf(0)
const world = await createWorld()
progress(`database ${world.database}, Redis prefix ${world.redisPrefix}${pinned ? '; wrk on core 0, servers on core 1' : ''}`)
const running = new Set<Server>()

const startApi = async (name: string, extraArgs: string[] = []) => {
  const env = { ...world.env, ...metricsEnv, PORT: String(ports.api) }
  const api = spawnBun(name, [...extraArgs, 'src/main.ts', '--api'], env, { cpu: 1, port: ports.api, role: 'api' })
  running.add(api)
  await waitHealthy(api)
  return api
}
const stop = async (server: Server | undefined) => {
  if (!server) return
  running.delete(server)
  const code = await server.stop()
  if (code !== 0) progress(`${server.name} exited with ${code}; see bench/.out/${server.name}.log`)
}

try {
  const machine = await describeMachine(world, { wrk: wrkVersion(wrk) })
  const results: Results = {
    date: new Date(),
    machine,
    settings,
    pinned,
    seconds: 0,
    loadavg: { start: loadavg(), end: [] },
    baselines: [],
    polls: [],
    streams: [],
    invoices: [],
    sizes,
    notes: '',
  }
  // The first API process migrates the fresh database as it starts.
  await stop(await startApi('api-migrate'))
  const workerArgs = profile === 'reply' ? cpuProfile('reply-workers-profile') : []
  const workers = spawnBun('workers', [...workerArgs, 'src/main.ts', '--workers'], world.env)
  running.add(workers)
  await waitForWorkers(world, workers)
  progress(`workers up (pid ${workers.pid})`)
  const bench: Bench = { settings, world, wrk, generatorCpu: pinned ? 0 : undefined, workers }

  if (only.has('poll') || only.has('reply') || only.has('baseline')) {
    await loadPhases(bench, results)
  }
  if (only.has('streams')) {
    for (const count of options.streamSizes) results.streams.push(await streamsPhase(count))
  }
  if (only.has('invoices')) {
    for (const periods of options.periodSizes) {
      progress(`invoice run: ${periods.toLocaleString('en-US')} ended periods`)
      const run = await invoiceScenario(world, workers, { periods, progress })
      results.invoices.push(run)
      if (!run.first.finished) {
        progress('  the worker is still on that run: the larger sizes are left out')
        break
      }
    }
  }
  await stop(workers)
  results.seconds = (performance.now() - begun) / 1000
  results.loadavg.end = loadavg()
  writeReport(results)
} catch (error) {
  console.error(error)
  process.exitCode = 1
} finally {
  for (const server of [...running]) await stop(server)
  await world.destroy().catch(error => console.error('cleanup failed:', error))
  progress(`dropped ${world.database} and the ${world.redisPrefix} keys`)
}

/** The bare route, the poll at each size and the replies, the bare route's runs alternating with theirs. */
async function loadPhases(bench: Bench, results: Results): Promise<void> {
  const seeding = performance.now()
  const most = only.has('poll') ? Math.max(...options.pollSizes) : sizes.agents
  const agents = await seedAgents(world.sql, { agents: most, pendingEvery: 100, repliers: 1000 })
  progress(`seeded ${agents.length} agents with keys and ${agents.filter(a => a.pending).length} pending conversations in ${seconds(seeding)} s`)
  const keys = writeLines(
    'agent-keys',
    agents.slice(0, sizes.agents).map(agent => agent.key),
  )

  let baseline: Server | undefined
  if (only.has('baseline')) {
    baseline = await startBaseline(bench, { port: ports.baseline, cpu: 1, keys })
    running.add(baseline)
  }
  const measureBaseline = baseline
    ? async () => {
        const run = await baselineScenario(bench, baseline, keys)
        progress(`  bare route run ${results.baselines.length + 1}: ${describe(run)}`)
        results.baselines.push(run)
        return run
      }
    : undefined
  /** The baseline runs of a phase and the one right after it. */
  const phase = (start: number) => () => Array.from({ length: Math.min(settings.rounds + 1, results.baselines.length - start) }, (_, i) => start + i)
  const phases: [LoadRun, () => number[]][] = []

  if (only.has('poll')) {
    for (const size of options.pollSizes) {
      const api = await freshPollApi(agents.slice(0, size))
      progress(
        `agent poll, ${size.toLocaleString('en-US')} agents (API pid ${api.pid}): warming every agent, then ${settings.rounds} × ${settings.seconds / settings.rounds} s`,
      )
      const against = phase(results.baselines.length)
      const { poll } = await agentPollScenario(bench, api, agents.slice(0, size), measureBaseline)
      results.polls.push(poll)
      phases.push([poll, against])
      progress(`  poll: ${describe(poll)}; API RSS ${poll.rssBeforeMb.toFixed(0)} → ${poll.rssAfterMb.toFixed(0)} MB`)
      await stop(api)
    }
  }
  if (only.has('reply')) {
    const api = await startApi('api-replies', profile === 'reply' ? cpuProfile('reply-api-profile') : [])
    progress(`reply (API pid ${api.pid}): ${settings.rounds} × ${settings.seconds / settings.rounds} s`)
    let against = phase(results.baselines.length)
    results.reply = (await replyScenario(bench, api, agents, measureBaseline)).reply
    phases.push([results.reply, against])
    progress(`  reply: ${describe(results.reply)}, recorded ${results.reply.recorded}`)
    perReply(results.reply)

    const waiting = await prepareWaiting(bench, api, agents, progress)
    against = phase(results.baselines.length)
    results.replyWaiting = (await replyScenario(bench, api, agents, measureBaseline, waiting)).reply
    phases.push([results.replyWaiting, against])
    progress(`  reply to a waiting conversation: ${describe(results.replyWaiting)}, recorded ${results.replyWaiting.recorded}`)
    perReply(results.replyWaiting)
    await stop(api)
  }
  if (measureBaseline && (phases.length > 0 || results.baselines.length === 0)) await measureBaseline()
  for (const [run, against] of phases) run.against = against()
  await stop(baseline)
}

/** A fresh API process for one size of the poll; under --profile poll, one whose inboxes were built by another first. */
async function freshPollApi(agents: SeededAgent[]): Promise<Server> {
  if (profile !== 'poll') return startApi(`api-poll-${agents.length}`)
  // Inboxes built now stay in Redis; the profiled process then sees only key loads, inbox reads and polls.
  progress(`building ${agents.length} inboxes before profiling`)
  const builder = await startApi('api-poll-builder')
  await warmAgents(builder, agents)
  await stop(builder)
  return startApi('api-profiled', cpuProfile('poll-profile'))
}

/** Streams at one count on a fresh API process, so its memory is the streams' and not the earlier scenarios' caches. */
async function streamsPhase(asked: number): Promise<StreamsRun> {
  // Each stream is a socket in the API and one here, beside each process's own files and connections.
  const reserve = 500
  if (openFilesLimit() < asked + reserve) raiseOpenFiles(asked + reserve)
  const count = Math.min(asked, openFilesLimit() - reserve)
  if (count < asked) {
    progress(
      `  ${asked} streams asked, but the open-file limit (${openFilesLimit()} a process) could not be raised (that needs root with CAP_SYS_RESOURCE): ${count}`,
    )
  }
  const api = await startApi(`api-streams-${asked}`)
  progress(`streams: opening ${count.toLocaleString('en-US')} on a fresh API process (pid ${api.pid})`)
  try {
    const run = await streamsScenario(api, { streams: count, messages: 5, jwtSecret: world.jwtSecret, progress })
    return { ...run, asked, openFilesLimit: openFilesLimit() }
  } finally {
    await stop(api)
  }
}

function writeReport(results: Results): void {
  const notesFile = join(root, 'bench', 'notes.md')
  results.notes = existsSync(notesFile) ? readFileSync(notesFile, 'utf8') : ''
  if (results.baselines.length === 0 && results.streams.length === 0 && results.invoices.length === 0) return
  const report = join(options.complete ? join(root, 'bench') : outDir, 'RESULTS.md')
  writeFileSync(report, renderResults(results) + '\n')
  for (const t of targets(results)) progress(`${t.pass ? 'pass' : 'FAIL'}  ${t.scenario}: ${t.target} (${t.measured})`)
  progress(`report: ${report.slice(root.length + 1)}`)
  if (profile) progress(`profiles: bench/.out/${profile === 'poll' ? 'poll-profile.md' : 'reply-api-profile.md, reply-workers-profile.md'}`)
}

function seconds(since: number): string {
  return ((performance.now() - since) / 1000).toFixed(1)
}

/** A workers process is ready once BullMQ sees a worker on the invoices queue. */
async function waitForWorkers(world: World, workers: Server): Promise<void> {
  const { Queue } = await import('bullmq')
  const { Redis } = await import('ioredis')
  const connection = new Redis(world.env.REDIS_URL!, { maxRetriesPerRequest: null })
  const queue = new Queue('invoices', { connection, prefix: `${world.redisPrefix}bull` })
  try {
    const deadline = Date.now() + 60_000
    while ((await queue.getWorkersCount()) === 0) {
      if (workers.proc.exitCode !== null) throw new Error(`workers exited with ${workers.proc.exitCode}; see bench/.out/workers.log`)
      if (Date.now() > deadline) throw new Error('no worker on the invoices queue within 60 s')
      await Bun.sleep(100)
    }
  } finally {
    await queue.close()
    connection.disconnect()
  }
}
