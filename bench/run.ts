/** `bun run bench`: a fresh database and Redis prefix, the baseline and the service under load, five scenarios, bench/RESULTS.md. */
// Options: --only poll,reply (some scenarios; report in bench/.out/), --seconds, --rounds, --connections,
// --agents, --streams, --periods, and --profile poll|reply (one scenario under Bun's CPU profiler).
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { describeMachine } from './lib/machine.ts'
import { outDir, pinSelf, root, spawnBun, waitHealthy, type Server } from './lib/proc.ts'
import { renderResults, targets, type Results } from './lib/report.ts'
import { seedAgents, seedWaitingConversations, type SeededAgent } from './lib/seed-agents.ts'
import { createKeys } from '../src/keys.ts'
import { invalidateInbox } from '../src/conversations/inbox.ts'
import { createWorld, type World } from './lib/world.ts'
import type { LoadRun, ReplyRun } from './lib/types.ts'
import { baselineScenario, startBaseline } from './scenarios/baseline.ts'
import { agentPollScenario, warmAgents } from './scenarios/agent-poll.ts'
import { replyScenario } from './scenarios/reply.ts'
import { streamsScenario } from './scenarios/streams.ts'
import { invoiceScenario } from './scenarios/invoices.ts'

const { values } = parseArgs({
  options: {
    only: { type: 'string' },
    profile: { type: 'string' },
    seconds: { type: 'string', default: '12' },
    rounds: { type: 'string', default: '3' },
    warm: { type: 'string', default: '3' },
    connections: { type: 'string', default: '64' },
    agents: { type: 'string', default: '10000' },
    streams: { type: 'string', default: '5000' },
    periods: { type: 'string', default: '100000' },
  },
})
const all = ['baseline', 'poll', 'reply', 'streams', 'invoices'] as const
const profile = values.profile as 'poll' | 'reply' | undefined
if (profile && profile !== 'poll' && profile !== 'reply') throw new Error('--profile takes poll or reply')
const only = new Set<string>(profile ? [profile] : values.only ? values.only.split(',') : all)
const complete = all.every(name => only.has(name))
const settings = {
  connections: Number(values.connections),
  seconds: Number(values.seconds),
  rounds: Number(values.rounds),
  warmSeconds: Number(values.warm),
}
const ports = { baseline: 3100, api: 3101 }
const begun = performance.now()
const cpuProfile = (name: string) => ['--cpu-prof-md', `--cpu-prof-dir=${outDir}`, `--cpu-prof-name=${name}.md`]

const perReply = ({ perReply: c }: ReplyRun) =>
  progress(
    `  per reply: CPU µs API ${c.apiUs.toFixed(0)}, workers ${c.workersUs.toFixed(0)}, Postgres ${c.postgresUs.toFixed(0)}, Redis ${c.redisUs.toFixed(0)}; ${c.redisCommands.toFixed(1)} Redis commands, ${c.pgTransactions.toFixed(2)} Postgres transactions`,
  )
const progress = (line: string) => console.log(`[${((performance.now() - begun) / 1000).toFixed(0).padStart(4)} s] ${line}`)
const describe = (run: LoadRun, role: string) =>
  `${Math.round(run.load.rps)} req/s, p50 ${run.load.p50.toFixed(2)} ms, p99 ${run.load.p99.toFixed(2)} ms, ` +
  `${role} CPU ${run.processes[role]!.cpu.toFixed(2)}, statuses ${JSON.stringify(run.load.statuses)}`

const pinned = pinSelf(0)
const world = await createWorld()
progress(`database ${world.database}, Redis prefix ${world.redisPrefix}${pinned ? '; generator on core 0, servers on core 1' : ''}`)
const running = new Set<Server>()

const startApi = async (name: string, extraArgs: string[] = []) => {
  const env = { ...world.env, PORT: String(ports.api) }
  const api = spawnBun(name, [...extraArgs, 'src/main.ts', '--api'], env, { cpu: 1, port: ports.api, role: 'api' })
  running.add(api)
  await waitHealthy(api)
  return api
}
const stop = async (server: Server) => {
  running.delete(server)
  const code = await server.stop()
  if (code !== 0) progress(`${server.name} exited with ${code}; see bench/.out/${server.name}.log`)
}

try {
  const machine = await describeMachine(world)
  const results: Results = { date: new Date(), machine, settings, pinned, seconds: 0, baselines: [], notes: '' }

  // The service migrates the fresh database as it starts.
  let api = await startApi('api', profile === 'reply' ? cpuProfile('reply-api-profile') : [])
  progress(`API up (pid ${api.pid})`)
  const workers = spawnBun('workers', [...(profile === 'reply' ? cpuProfile('reply-workers-profile') : []), 'src/main.ts', '--workers'], world.env)
  running.add(workers)
  await waitForWorkers(world, workers)
  progress(`workers up (pid ${workers.pid})`)

  let agents: SeededAgent[] = []
  if (only.has('poll') || only.has('reply') || only.has('baseline')) {
    const seeding = performance.now()
    agents = await seedAgents(world.sql, { agents: Number(values.agents), pendingEvery: 100, repliers: 1000 })
    const pending = agents.filter(a => a.pending).length
    progress(
      `seeded ${agents.length} agents with keys and ${pending} pending conversations in ${((performance.now() - seeding) / 1000).toFixed(1)} s`,
    )
  }
  const keys = agents.map(agent => agent.key)

  if (profile === 'poll') {
    // Inboxes built now stay in Redis; the profiled process then sees only key loads, inbox reads and polls.
    progress(`building ${agents.length} inboxes before profiling`)
    await warmAgents(api, agents)
    await stop(api)
    api = await startApi('api-profiled', cpuProfile('poll-profile'))
    progress(`API under the CPU profiler (pid ${api.pid})`)
  }

  // Baseline runs alternate with the poll's and the replies' runs, and one closes the last of them.
  let baseline: Server | undefined
  if (only.has('baseline')) {
    baseline = await startBaseline(settings, { port: ports.baseline, cpu: 1, keys, env: world.env })
    running.add(baseline)
  }
  const measureBaseline = baseline
    ? async () => {
        const run = await baselineScenario(settings, baseline!, keys)
        progress(`  baseline run ${results.baselines.length + 1}: ${describe(run, 'baseline')}`)
        results.baselines.push(run)
        return run
      }
    : undefined
  /** The baseline runs of a phase and the one right after it. */
  const phase = (start: number) => () => Array.from({ length: Math.min(settings.rounds + 1, results.baselines.length - start) }, (_, i) => start + i)
  let pollAgainst: (() => number[]) | undefined
  let replyAgainst: (() => number[]) | undefined
  let waitingAgainst: (() => number[]) | undefined
  if (only.has('poll')) {
    progress(`agent poll: warming ${agents.length} agents, then ${settings.rounds} × ${settings.seconds / settings.rounds} s`)
    pollAgainst = phase(results.baselines.length)
    const { poll } = await agentPollScenario(settings, api, agents, measureBaseline)
    results.poll = poll
    progress(`  poll: ${describe(poll, 'api')}`)
  }
  if (only.has('reply')) {
    progress(`reply: ${settings.rounds} × ${settings.seconds / settings.rounds} s`)
    replyAgainst = phase(results.baselines.length)
    const { reply } = await replyScenario(settings, { api, workers }, world, agents, measureBaseline)
    results.reply = reply
    progress(`  reply: ${describe(reply, 'api')}, recorded ${reply.recorded}`)
    perReply(reply)

    // 3b: every reply answers a conversation that waits for it. Enough of them for 20,000 replies a
    // second through the warm-up and the rounds; each agent's inbox is built (a poll) before the run.
    const repliers = agents.filter(agent => agent.userId !== null).slice(0, 1000)
    const users = Math.ceil((20_000 * (settings.warmSeconds + settings.seconds)) / repliers.length)
    const seeding = performance.now()
    const waiting = await seedWaitingConversations(world.sql, repliers, users)
    // Seeded past the service: their inboxes (built by the poll's warm-up, if it ran) are rebuilt from Postgres.
    const keys = createKeys(world.redisPrefix)
    for (const agent of repliers) await invalidateInbox({ redis: world.redis, keys }, agent.id)
    await Bun.sleep(200) // the API's inbox caches hear of it
    await warmAgents(api, repliers, 64, false)
    const built = await Promise.all(repliers.map(agent => world.redis.exists(keys.agent(agent.id).built)))
    if (built.some(n => n !== 1)) throw new Error(`${built.filter(n => n !== 1).length} of the repliers' inboxes were not rebuilt`)
    progress(
      `reply to waiting conversations: ${waiting.length} seeded and ${repliers.length} inboxes built in ${((performance.now() - seeding) / 1000).toFixed(1)} s; ${settings.rounds} × ${settings.seconds / settings.rounds} s`,
    )
    waitingAgainst = phase(results.baselines.length)
    const answering = await replyScenario(settings, { api, workers }, world, agents, measureBaseline, waiting)
    results.replyWaiting = answering.reply
    progress(`  reply to a waiting conversation: ${describe(answering.reply, 'api')}, recorded ${answering.reply.recorded}`)
    perReply(answering.reply)
  }
  if (measureBaseline && (results.poll || results.reply || results.baselines.length === 0)) await measureBaseline()
  if (results.poll && pollAgainst) results.poll.against = pollAgainst()
  if (results.reply && replyAgainst) results.reply.against = replyAgainst()
  if (results.replyWaiting && waitingAgainst) results.replyWaiting.against = waitingAgainst()
  if (baseline) await stop(baseline)

  if (only.has('streams')) {
    // A fresh API process, so its memory is the streams' and not the earlier scenarios' caches.
    await stop(api)
    api = await startApi('api-streams')
    progress(`streams: opening ${values.streams} on a fresh API process (pid ${api.pid})`)
    results.streams = await streamsScenario(api, { streams: Number(values.streams), messages: 5, jwtSecret: world.jwtSecret, progress })
  }
  if (only.has('invoices')) {
    progress(`invoice run: seeding ${values.periods} ended periods`)
    results.invoices = await invoiceScenario(world, workers, { periods: Number(values.periods), progress })
  }

  await stop(api)
  await stop(workers)
  results.seconds = (performance.now() - begun) / 1000
  const notesFile = join(root, 'bench', 'notes.md')
  results.notes = existsSync(notesFile) ? readFileSync(notesFile, 'utf8') : ''
  if (results.baselines.length > 0) {
    const report = join(complete ? join(root, 'bench') : outDir, 'RESULTS.md')
    writeFileSync(report, renderResults(results) + '\n')
    for (const t of targets(results)) progress(`${t.pass ? 'pass' : 'FAIL'}  ${t.scenario}: ${t.target} (${t.measured})`)
    progress(`report: ${report.slice(root.length + 1)}`)
  }
  if (profile) progress(`profiles: bench/.out/${profile === 'poll' ? 'poll-profile.md' : 'reply-api-profile.md, reply-workers-profile.md'}`)
} catch (error) {
  console.error(error)
  process.exitCode = 1
} finally {
  for (const server of [...running]) await stop(server)
  await world.destroy().catch(error => console.error('cleanup failed:', error))
  progress(`dropped ${world.database} and the ${world.redisPrefix} keys`)
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
