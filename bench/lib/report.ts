/** RESULTS.md: the machine, the versions, one table per scenario with ratios to the baseline, the targets. */
import type { LoadResult } from './load.ts'
import type { Machine } from './machine.ts'
import { int, mb, ms, pct } from './stats.ts'
import type { InvoiceRun, LoadRun, PollRun, ReplyRun, Settings, StreamsRun } from './types.ts'

export interface Results {
  date: Date
  machine: Machine
  settings: Settings
  pinned: boolean
  seconds: number
  baselines: LoadRun[]
  poll?: PollRun
  reply?: ReplyRun
  /** Replies that each answer a waiting conversation (3b). */
  replyWaiting?: ReplyRun
  streams?: StreamsRun
  invoices?: InvoiceRun
  /** Hand-written notes (the profile, before/after) appended as they are. */
  notes: string
}

export interface Target {
  scenario: string
  target: string
  measured: string
  pass: boolean
}

const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / Math.max(1, values.length)
const x = (value: number, base: number) => (base > 0 ? `${(value / base).toFixed(2)}×` : 'n/a')
const non2xx = (load: LoadResult) =>
  Object.entries(load.statuses)
    .filter(([status]) => !status.startsWith('2'))
    .reduce((sum, [, count]) => sum + count, 0) + load.errors

/** A baseline to compare with: the mean of the given baseline runs of this run (all of them by default). */
export function baselineOf(results: Results, against?: number[]) {
  const picked = against?.length ? against.map(i => results.baselines[i]!).filter(Boolean) : results.baselines
  const runs = picked.length > 0 ? picked : results.baselines
  return {
    rps: mean(runs.map(r => r.load.rps)),
    p50: mean(runs.map(r => r.load.p50)),
    p99: mean(runs.map(r => r.load.p99)),
    peakMb: Math.max(...runs.map(r => r.processes.baseline!.peakMb)),
    cpu: mean(runs.map(r => r.processes.baseline!.cpu)),
    /** Server CPU per request, µs. */
    cpuUs: mean(runs.map(r => (r.processes.baseline!.cpu * 1e6) / r.load.rps)),
  }
}

/** Server CPU per request in µs. */
const cpuUs = (run: LoadRun, role: string) => (run.processes[role]!.cpu * 1e6) / run.load.rps

export function targets(results: Results): Target[] {
  const out: Target[] = []
  const { poll, reply, replyWaiting, streams, invoices } = results
  if (poll) {
    const base = baselineOf(results, poll.against)
    out.push({
      scenario: 'Agent poll',
      target: '≥ 70 % of baseline req/s',
      measured: pct(poll.load.rps / base.rps),
      pass: poll.load.rps >= 0.7 * base.rps,
    })
    const perCore = base.cpuUs / cpuUs(poll, 'api')
    out.push({
      scenario: 'Agent poll',
      target: '≥ 70 % of baseline req/s per server core (generator-independent)',
      measured: pct(perCore),
      pass: perCore >= 0.7,
    })
    out.push({ scenario: 'Agent poll', target: 'p99 < 10 ms', measured: ms(poll.load.p99), pass: poll.load.p99 < 10 })
  }
  if (reply) {
    const base = baselineOf(results, reply.against)
    out.push({
      scenario: 'Reply',
      target: '≥ 25 % of baseline req/s',
      measured: pct(reply.load.rps / base.rps),
      pass: reply.load.rps >= 0.25 * base.rps,
    })
  }
  if (replyWaiting) {
    const base = baselineOf(results, replyWaiting.against)
    out.push({
      scenario: 'Reply to a waiting conversation',
      target: '≥ 25 % of baseline req/s',
      measured: pct(replyWaiting.load.rps / base.rps),
      pass: replyWaiting.load.rps >= 0.25 * base.rps,
    })
  }
  if (streams) {
    out.push({
      scenario: 'Streams',
      target: `${int(streams.streams)} streams in < 300 MB`,
      measured: `${int(streams.opened)} open, peak ${mb(streams.peakMb)}`,
      pass: streams.opened === streams.streams && streams.peakMb < 300,
    })
    const worst = Math.max(...streams.messages.map(m => m.p99))
    out.push({
      scenario: 'Streams',
      target: 'every stream within 1 s at p99',
      measured: `worst message p99 ${ms(worst)}, ${streams.all.missing} missing`,
      pass: worst < 1000 && streams.all.missing === 0,
    })
  }
  if (invoices) {
    out.push({
      scenario: 'Invoice run',
      target: `${int(invoices.periods)} periods in < 30 s`,
      measured: `${int(invoices.first.issued)} in ${invoices.first.seconds.toFixed(1)} s`,
      pass: invoices.first.issued === invoices.periods && invoices.first.seconds < 30,
    })
    out.push({
      scenario: 'Invoice run',
      target: 'second run issues 0',
      measured: String(invoices.second.issued),
      pass: invoices.second.issued === 0 && invoices.duplicates === 0,
    })
  }
  return out
}

export function renderResults(results: Results): string {
  const { machine, settings } = results
  const base = baselineOf(results)
  const lines: string[] = []
  const push = (...more: string[]) => lines.push(...more)

  push(
    '# Benchmark results',
    '',
    `Written by \`bun run bench\` (bench/run.ts) on ${results.date.toISOString().slice(0, 16).replace('T', ' ')} UTC; the run took ${(results.seconds / 60).toFixed(1)} min.`,
    '',
    '## Machine and versions',
    '',
    `- ${machine.cores} cores (${machine.cpu}), ${machine.memoryGiB.toFixed(1)} GiB memory, Linux ${machine.kernel}; a shared machine, so every ratio is against the baseline measured in the same run.`,
    `- ${Object.entries(machine.versions)
      .map(([name, version]) => `${name} ${version}`)
      .join(', ')}.`,
    '',
    '## How it was measured',
    '',
    `- Load: autocannon's programmatic API in the orchestrator process, ${settings.connections} connections, ${settings.warmSeconds} s of warm-up, then ${settings.seconds} s measured per scenario; every request picks a random agent key (the baseline's too, so the generator does the same work). Latencies are kept per request (autocannon's own histogram rounds to 1 ms).`,
    results.pinned
      ? '- The server under load (baseline or `src/main.ts --api`) is pinned to core 1, the generator to core 0 (taskset); the workers process, PostgreSQL and Redis float on both cores.'
      : '- taskset was not found: nothing is pinned.',
    `- Baseline: \`bench/baseline-server.ts\`, one Elysia GET route returning a small JSON object, listening with src/main.ts's settings. It stays up through the load scenarios, and its runs alternate with theirs: the poll and the replies are each measured in ${results.settings.rounds} rounds of ${results.settings.seconds / results.settings.rounds} s, each round after a baseline run of the same length, and one more baseline run closes each phase. Each scenario is compared with the mean of the baseline runs of its phase, so a slow or fast spell of the shared machine falls on both sides of a ratio.`,
    '- Memory: peak RSS (VmHWM, reset at the start of each measurement, and RSS sampled every 100 ms) of each server process. CPU: the cores a process used on average while measured. "Server CPU per request" is that divided by the throughput, and "req/s per server core" its inverse: what the server does per core, whatever limits the load. The generator (one JavaScript thread on one core) tops out around the bare route\'s throughput, so the baseline server is not saturated and the plain req/s ratio flatters the service; the per-core ratio does not.',
    '',
  )

  push(
    '## Summary',
    '',
    '| scenario | throughput | p50 | p99 | peak memory (API) | ratios to baseline (req/s, p50, p99, memory) |',
    '|---|---:|---:|---:|---:|---|',
  )
  push(`| 1. Baseline | ${int(base.rps)} req/s | ${ms(base.p50)} | ${ms(base.p99)} | ${mb(base.peakMb)} | 1.00×, 1.00×, 1.00×, 1.00× |`)
  for (const [label, run] of [
    ['2. Agent poll', results.poll],
    ['3. Reply', results.reply],
    ['3b. Reply to a waiting conversation', results.replyWaiting],
  ] as const) {
    if (!run) continue
    const api = run.processes.api!
    const b = baselineOf(results, run.against)
    push(
      `| ${label} | ${int(run.load.rps)} req/s | ${ms(run.load.p50)} | ${ms(run.load.p99)} | ${mb(api.peakMb)} | ${x(run.load.rps, b.rps)}, ${x(run.load.p50, b.p50)}, ${x(run.load.p99, b.p99)}, ${x(api.peakMb, b.peakMb)} |`,
    )
  }
  if (results.streams) {
    const s = results.streams
    push(
      `| 4. Streams (${int(s.opened)} open; a message's delivery to all, ${s.messages.length} messages) | — | ${ms(s.all.p50)} | ${ms(s.all.p99)} | ${mb(s.peakMb)} | —, —, —, ${x(s.peakMb, base.peakMb)} |`,
    )
  }
  if (results.invoices) {
    const i = results.invoices
    push(
      `| 5. Invoice run (${int(i.periods)} periods) | ${int(i.first.issued / i.first.seconds)} invoices/s, ${i.first.seconds.toFixed(1)} s | — | — | ${mb(i.workersPeakMb)} (workers) | —, —, —, ${x(i.workersPeakMb, base.peakMb)} |`,
    )
  }
  push('', '### Targets', '', '| scenario | target | measured | result |', '|---|---|---|---|')
  for (const t of targets(results)) push(`| ${t.scenario} | ${t.target} | ${t.measured} | ${t.pass ? 'pass' : '**fail**'} |`)
  push('')

  const loadHeader =
    '| run | req/s | p50 | p99 | max | non-2xx/errors | server CPU (cores) | server CPU per request | req/s per server core | peak RSS |'
  const loadRule = '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
  const loadRow = (label: string, run: LoadRun, role: string, b: ReturnType<typeof baselineOf>) => {
    const p = run.processes[role]!
    const us = cpuUs(run, role)
    return `| ${label} | ${int(run.load.rps)} (${x(run.load.rps, b.rps)}) | ${ms(run.load.p50)} (${x(run.load.p50, b.p50)}) | ${ms(run.load.p99)} (${x(run.load.p99, b.p99)}) | ${ms(run.load.max)} | ${non2xx(run.load)} | ${p.cpu.toFixed(2)} | ${us.toFixed(1)} µs (${x(us, b.cpuUs)}) | ${int(1e6 / us)} (${x(b.cpuUs, us)}) | ${mb(p.peakMb)} (${x(p.peakMb, b.peakMb)}) |`
  }

  push('## 1. Baseline', '', 'GET / on bench/baseline-server.ts; ratios to the mean of all runs.', '', loadHeader, loadRule)
  results.baselines.forEach((run, i) => push(loadRow(`run ${i + 1}`, run, 'baseline', base)))
  push(
    `| mean | ${int(base.rps)} | ${ms(base.p50)} | ${ms(base.p99)} | | | ${base.cpu.toFixed(2)} | ${base.cpuUs.toFixed(1)} µs | ${int(1e6 / base.cpuUs)} | ${mb(base.peakMb)} |`,
    '',
  )

  const against = (run: LoadRun) =>
    run.against?.length
      ? `Ratios to the mean of baseline runs ${run.against[0]! + 1} to ${run.against[run.against.length - 1]! + 1}, which alternated with this scenario's rounds.`
      : ''
  if (results.poll) {
    const p = results.poll
    push(
      '## 2. Agent poll',
      '',
      `GET /v1/agent/events with ${int(p.agents)} registered agents, ${int(p.pendingAgents)} (1 %) with a pending conversation (${int(p.pendingSeen)} seen by the warm-up poll, which also built every inbox and cached every key), a random agent's X-API-Key per request.`,
      '',
      loadHeader,
      loadRule,
      loadRow('API', p, 'api', baselineOf(results, p.against)),
      '',
      against(p),
      '',
    )
  }
  const replySection = (heading: string, r: ReplyRun, what: string) => {
    const workers = r.processes.workers
    push(
      heading,
      '',
      `${what} ${int(r.recorded)} agent messages were recorded in Postgres while ${int(r.load.statuses['201'] ?? 0)} replies were answered 201 (requests cut off when a round ended still land).`,
      '',
      loadHeader,
      loadRule,
      loadRow('API', r, 'api', baselineOf(results, r.against)),
      '',
      against(r),
      '',
      workers ? `The workers process used ${workers.cpu.toFixed(2)} cores and peaked at ${mb(workers.peakMb)}.` : '',
      '',
      "What one reply costs (CPU from /proc for the API, the workers and the run's PostgreSQL backends, Redis's own count for itself; Redis commands are every client's):",
      '',
      '| API CPU | workers CPU | PostgreSQL CPU | Redis CPU | total CPU | Redis commands | PostgreSQL transactions |',
      '|---:|---:|---:|---:|---:|---:|---:|',
      `| ${r.perReply.apiUs.toFixed(0)} µs | ${r.perReply.workersUs.toFixed(0)} µs | ${r.perReply.postgresUs.toFixed(0)} µs | ${r.perReply.redisUs.toFixed(0)} µs | ${(r.perReply.apiUs + r.perReply.workersUs + r.perReply.postgresUs + r.perReply.redisUs).toFixed(0)} µs | ${r.perReply.redisCommands.toFixed(1)} | ${r.perReply.pgTransactions.toFixed(2)} |`,
      '',
    )
  }
  if (results.reply) {
    replySection(
      '## 3. Reply',
      results.reply,
      `POST /v1/agent/conversation-reply from a random one of ${int(results.reply.agents)} agents to its conversation; each is written by the API process that received it, with the other replies of the moment, in one autocommit statement that takes each conversation's row, stores the message and ends the pending state (src/conversations/replies.ts); a conversation that was pending then leaves the agent's inbox in Redis (a projection ordered by the conversation's version), the agent is answered, and the user is told (a per-user event stream and pub/sub). The seeded conversations were answered before the run, so these replies find nothing pending and leave the inbox alone, as an agent's follow-ups do; 3b measures the replies that answer.`,
    )
  }
  if (results.replyWaiting) {
    const r = results.replyWaiting
    replySection(
      '## 3b. Reply to a waiting conversation',
      r,
      `The same requests, each to a different conversation that waits for its reply: ${int(r.agents)} agents with a user's message from each of many users, every agent's inbox built in Redis (a poll each) before the run, and the conversations taken in a random order, each once (${int(r.answered ?? 0)} of them, warm-up included). So every reply also takes its conversation out of the agent's inbox and announces that to every API process, as an agent answering what it polled does.`,
    )
  }
  if (results.streams) {
    const s = results.streams
    push(
      '## 4. Streams',
      '',
      `${int(s.opened)} of ${int(s.streams)} GET /v1/events/chat streams opened on one fresh API process in ${s.openSeconds.toFixed(1)} s (raw TCP sockets from the orchestrator, each counted open at its \`retry: 3000\`). Then ${s.messages.length} chat messages, each timed from the moment its POST /v1/chat/messages was sent to its arrival on every stream.`,
      '',
      `The open-file limit was ${machine.openFiles} per process, enough for ${int(s.streams)} sockets on each side, so it was not raised. Delivery times include the orchestrator reading all the sockets in one JavaScript thread on its own core, so they are an upper bound on the server's.`,
      '',
      `API memory: ${mb(s.rssIdleMb)} RSS before the streams, ${mb(s.rssOpenMb)} with them open (${(((s.rssOpenMb - s.rssIdleMb) * 1024) / Math.max(1, s.opened)).toFixed(1)} KB a stream), peak ${mb(s.peakMb)} (${x(s.peakMb, base.peakMb)} the baseline server's).`,
      '',
      '| message | delivered | missing | p50 | p99 | max |',
      '|---|---:|---:|---:|---:|---:|',
      ...s.messages.map((m, i) => `| ${i + 1} | ${int(m.delivered)} | ${m.missing} | ${ms(m.p50)} | ${ms(m.p99)} | ${ms(m.max)} |`),
      `| all | ${int(s.all.delivered)} | ${s.all.missing} | ${ms(s.all.p50)} | ${ms(s.all.p99)} | ${ms(s.all.max)} |`,
      '',
    )
  }
  if (results.invoices) {
    const i = results.invoices
    push(
      '## 5. Invoice run',
      '',
      `${int(i.periods)} ended subscription periods with usage (10 agents' plans, ${int(i.periods / 10)} payers, 1 to 8 proxy calls each over 3 included), seeded with SQL in ${i.seedSeconds.toFixed(1)} s. The run is a job on the \`invoices\` queue, taken by the workers process; times are from enqueueing to the job's completion. The run also creates the ${int(i.periods)} current periods, as the first run after a month turns does, and publishes one \`invoice.issued\` event per invoice.`,
      '',
      '| run | issued | time | in the worker | invoices/s |',
      '|---|---:|---:|---:|---:|',
      `| first | ${int(i.first.issued)} | ${i.first.seconds.toFixed(1)} s | ${i.first.processSeconds.toFixed(1)} s | ${int(i.first.issued / i.first.seconds)} |`,
      `| second | ${int(i.second.issued)} | ${i.second.seconds.toFixed(2)} s | | |`,
      '',
      `Invoices in Postgres after both runs: ${int(i.first.counted)}; periods invoiced twice: ${i.duplicates}. The workers process peaked at ${mb(i.workersPeakMb)}.`,
      '',
    )
  }
  if (results.notes.trim()) push(results.notes.trim(), '')
  return lines.filter((line, i, all) => !(line === '' && all[i - 1] === '')).join('\n')
}
