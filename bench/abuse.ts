/**
 * `npm run bench:abuse`: 100 well-behaved agents poll and reply while one attacker, phase after phase,
 * sends as fast as it can on one vector; the agents' timings and the service's memory, bench/.out/ABUSE.md.
 */
// Options: --seconds (each phase), --concurrency (the attacker's requests at once), --poll-ms,
// --upstream-delay-ms (the slow upstream's wait), --only service-requests,proxy-calls (the baseline always runs).
import { availableParallelism } from 'node:os'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { freePort } from '../test/helpers/ports.ts'
import { runAttacker, vectors, type AttackPlan, type AttackResult } from './lib/abuse-attacker.ts'
import { startWellBehaved, type WellBehavedLoad } from './lib/abuse-agents.ts'
import { watchMemory } from './lib/abuse-memory.ts'
import { createRecorder, wallClock, type Recorder } from './lib/abuse-recorder.ts'
import { describePhase, renderAbuse, type AbuseRun, type PhaseResult } from './lib/abuse-report.ts'
import { seedAbuseAccounts, wellBehavedAgents, type AbuseAccounts } from './lib/abuse-seed.ts'
import { startService, type Service } from './lib/abuse-service.ts'
import { startSlowUpstream } from './lib/abuse-upstream.ts'
import { outDir, pinSelf, root } from './lib/proc.ts'
import { createWorld } from './lib/world.ts'

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    concurrency: { type: 'string', default: '64' },
    'poll-ms': { type: 'string', default: '200' },
    'upstream-delay-ms': { type: 'string', default: '2000' },
    only: { type: 'string' },
  },
})
const only = values.only ? values.only.split(',') : [...vectors]
const unknown = only.filter(name => !(vectors as readonly string[]).includes(name))
if (unknown.length > 0) throw new Error(`--only takes ${vectors.join(', ')}; not ${unknown.join(', ')}`)
const settings: AbuseRun['settings'] = {
  seconds: Number(values.seconds),
  concurrency: Number(values.concurrency),
  agents: wellBehavedAgents,
  pollMs: Number(values['poll-ms']),
  // A user may post 30 messages a minute (messagePost): one every 2 to 6 s stays well within it.
  messageEveryMs: [2000, 6000],
  upstreamDelayMs: Number(values['upstream-delay-ms']),
}
for (const [name, value] of Object.entries({
  seconds: settings.seconds,
  concurrency: settings.concurrency,
  'poll-ms': settings.pollMs,
  'upstream-delay-ms': settings.upstreamDelayMs,
})) {
  if (!Number.isFinite(value) || value <= 0) throw new Error(`--${name} takes a positive number`)
}
const phases: PhaseResult['name'][] = ['baseline', ...vectors.filter(vector => only.includes(vector))]
// Load before the baseline: inboxes built, the seeded waiting conversations answered.
const warmSeconds = 3
// Between phases: what an attack left in flight ends before the next phase is measured.
const settleMs = 2000
const begun = performance.now()
const progress = (line: string) => console.log(`[${((performance.now() - begun) / 1000).toFixed(0).padStart(4)} s] ${line}`)

const pinned = pinSelf(0)
const world = await createWorld()
progress(`database ${world.database}, Redis prefix ${world.redisPrefix}`)
const upstream = startSlowUpstream(settings.upstreamDelayMs)
let service: Service | undefined
let load: WellBehavedLoad | undefined
try {
  service = await startService(world, await freePort())
  progress(`API up (pid ${service.api.pid}, ${service.api.url}), workers up (pid ${service.workers.pid}); upstream ${upstream.url}`)
  const accounts = await seedAbuseAccounts(world.sql, world.jwtSecret)
  await connectUpstream(service.api.url, accounts, upstream.url)
  progress(`seeded ${accounts.agents.length} well-behaved agents with a subscriber each, and the attacker`)

  const recorder = createRecorder()
  // Every loop ends by itself by then, whatever happens here.
  const deadline = wallClock() + (warmSeconds + phases.length * (settings.seconds + 60)) * 1000
  load = startWellBehaved(accounts.agents, recorder, {
    api: service.api.url,
    pollMs: settings.pollMs,
    messageEveryMs: settings.messageEveryMs,
    deadline,
  })
  await Bun.sleep(warmSeconds * 1000)
  const results: PhaseResult[] = []
  for (const name of phases) {
    progress(`${name}: ${describePhase(name, settings.upstreamDelayMs)}, ${settings.seconds} s`)
    const result = await runPhase(name, service, accounts, recorder)
    results.push(result)
    progress(`  ${summary(result)}`)
    await Bun.sleep(settleMs)
  }
  await load.stop()
  const failed = await service.stop()
  service = undefined
  if (failed.length > 0) progress(`${failed.join(' and ')} exited uncleanly; see bench/.out/${failed[0]}.log`)

  const report = renderAbuse({
    date: new Date(),
    cores: availableParallelism(),
    pinned,
    settings,
    phases: results,
    totalSeconds: (performance.now() - begun) / 1000,
  })
  const file = join(outDir, 'ABUSE.md')
  writeFileSync(file, report + '\n')
  console.log(`\n${report}\n`)
  progress(`report: ${file.slice(root.length + 1)}`)
} catch (error) {
  console.error(error)
  process.exitCode = 1
} finally {
  await load?.stop()
  await service?.stop()
  await upstream.stop()
  await world.destroy().catch(error => console.error('cleanup failed:', error))
  progress(`dropped ${world.database} and the ${world.redisPrefix} keys`)
}

/** One phase: the attacker for `settings.seconds` (none in the baseline), the memory watched meanwhile. */
async function runPhase(name: PhaseResult['name'], service: Service, accounts: AbuseAccounts, recorder: Recorder): Promise<PhaseResult> {
  const watch = await watchMemory(service.api.pid, world.redis, world.redisPrefix)
  let load: Awaited<ReturnType<typeof phaseLoad>>
  try {
    load = await phaseLoad(name, service, accounts)
  } catch (error) {
    // Its timers would otherwise keep the bench alive.
    await watch.stop().catch(() => {})
    throw error
  }
  const memory = await watch.stop()
  const { from, to, attack } = load
  return { name, seconds: (to - from) / 1000, wellBehaved: recorder.window(from, to), attack, memory }
}

/** The phase's attack, if any, and its window: from the attacker's first request to its last answer (its process's start is not part of it). */
async function phaseLoad(
  name: PhaseResult['name'],
  service: Service,
  accounts: AbuseAccounts,
): Promise<{ from: number; to: number; attack: AttackResult | null }> {
  if (name === 'baseline') {
    const from = wallClock()
    await Bun.sleep(settings.seconds * 1000)
    return { from, to: wallClock(), attack: null }
  }
  const plan: AttackPlan = {
    api: service.api.url,
    vector: name,
    seconds: settings.seconds,
    concurrency: settings.concurrency,
    attacker: accounts.attacker,
    targetAgentId: accounts.agents[0]!.id,
    floodedAgentId: accounts.agents[1]!.id,
  }
  const attack = await runAttacker(plan)
  return { from: attack.from, to: attack.to, attack }
}

function summary(result: PhaseResult): string {
  const w = result.wellBehaved
  const attack = result.attack ? `attacker ${result.attack.requests} requests ${JSON.stringify(result.attack.statuses)}; ` : ''
  return (
    `${attack}poll p50 ${w.poll.p50.toFixed(1)} ms p99 ${w.poll.p99.toFixed(1)} ms (${w.poll.requests}), ` +
    `reply p50 ${w.reply.p50.toFixed(1)} ms p99 ${w.reply.p99.toFixed(1)} ms (${w.reply.requests}); ` +
    `API RSS ${result.memory.apiBeforeMb.toFixed(0)} → ${result.memory.apiPeakMb.toFixed(0)} MB`
  )
}

/** The attacker's subscriber connects an account on the slow upstream, as any user connects one (through the API). */
async function connectUpstream(api: string, accounts: AbuseAccounts, upstreamUrl: string): Promise<void> {
  const response = await fetch(`${api}/v1/connections`, {
    method: 'POST',
    headers: { authorization: `Bearer ${accounts.attacker.subscriberToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ provider: 'slow', baseUrl: upstreamUrl, credential: 'bench-upstream-token' }),
  })
  if (response.status !== 201) throw new Error(`connecting the upstream: ${response.status} ${await response.text()}`)
}
