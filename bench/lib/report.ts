/** RESULTS.md: the machine and its load, how it was measured, the summary and targets, then a section per scenario. */
import { baselineOf, cpuUs, mainInvoices, mainPoll, mainStreams, spreadLimit, type Results } from './figures.ts'
import { baselineSection, pollSection, replySections } from './report-load.ts'
import { invoicesSection, pollScalingSection, streamsSection } from './report-scaling.ts'
import { targets } from './targets.ts'
import { int, mb, ms, pct } from './stats.ts'

export type { Results } from './figures.ts'
export { targets } from './targets.ts'

const x = (value: number, base: number) => (base > 0 ? `${(value / base).toFixed(2)}×` : 'n/a')
const averages = (values: number[]) => values.map(v => v.toFixed(2)).join(' / ')

function header(results: Results): string[] {
  const { machine, settings } = results
  const measured = [...results.baselines, ...results.polls, results.reply, results.replyWaiting].filter(r => r !== undefined)
  const busiest = Math.max(0, ...measured.flatMap(r => r.loadavg))
  return [
    '# Benchmark results',
    '',
    `Written by \`bun run bench\` (bench/run.ts) on ${results.date.toISOString().slice(0, 16).replace('T', ' ')} UTC; the run took ${(results.seconds / 60).toFixed(1)} min.`,
    '',
    '## Machine, versions and load',
    '',
    `- ${machine.cores} cores (${machine.cpu}), ${machine.memoryGiB.toFixed(1)} GiB memory, Linux ${machine.kernel}; every ratio is against the bare route measured in the same run.`,
    `- ${Object.entries(machine.versions)
      .map(([name, version]) => `${name} ${version}`)
      .join(', ')}.`,
    `- Load average (1 / 5 / 15 min): ${averages(results.loadavg.start)} as the run began, ${averages(results.loadavg.end)} as it ended, at most ${busiest.toFixed(2)} (1 min) beside a measured run; each run's own is in its table. The bench itself keeps about ${machine.cores} to ${machine.cores + 1} busy while it measures: more than that is someone else's.`,
    '',
    '## How it was measured',
    '',
    `- Load: wrk (${settings.threads} thread${settings.threads === 1 ? '' : 's'}, ${settings.connections} connections) with bench/wrk/requests.lua, which gives every request a random agent's key (the bare route's too, so the generator does the same work) or, for replies, the agent's key and its user in the body; in 3b each waiting conversation is taken once. ${settings.warmSeconds} s of warm-up, then ${settings.seconds} s measured per scenario in ${settings.rounds} rounds. Latencies are wrk's (a 1 µs histogram, corrected by wrk for coordinated omission); rounds are merged through each round's latency quantiles. Non-2xx counts statuses of 400 and above (wrk's own count) plus socket errors; replies count every status.`,
    results.pinned
      ? '- The server under load (the bare route or `src/main.ts --api`) is pinned to core 1 and wrk to core 0 (taskset); the workers process, PostgreSQL and Redis float on both cores.'
      : '- taskset was not found: nothing is pinned.',
    `- Baseline: \`bench/baseline-server.ts\`, one Elysia GET route returning a small JSON object, listening with src/main.ts's settings. It stays up through the load scenarios, and its runs alternate with theirs: each round of a scenario follows a bare-route run of the same length, and one more closes each phase. Each scenario is compared with the median of the bare-route runs of its phase (figure by figure), so that one disturbed run moves its ratios little. A phase whose bare-route runs varied more than ${pct(spreadLimit)} in requests a second says so.`,
    "- CPU: of the server and the workers from /proc, of PostgreSQL summed over the run's backends, of Redis from its own count (the whole server: other clients of a shared Redis are in it), of wrk from its resource usage. CPU a request is a process's CPU over the requests answered; each is also given as a ratio to the bare route server's CPU a request. \"req/s per server core\" is the inverse of the server's CPU a request: what the server does per core, whatever limits the load. Generator cores near 1.0 would mean wrk, not the server, set the pace.",
    '- Memory: peak RSS (VmHWM, reset at the start of each measurement, and RSS sampled every 100 ms) of each server process.',
    '',
  ]
}

function summary(results: Results): string[] {
  const base = baselineOf(results)
  const lines = [
    '## Summary',
    '',
    '| scenario | throughput | p50 | p99 | server CPU a request | ratios to the bare route (req/s, p50, p99, CPU a request) |',
    '|---|---:|---:|---:|---:|---|',
    `| 1. Baseline | ${int(base.rps)} req/s | ${ms(base.p50)} | ${ms(base.p99)} | ${base.cpuUs.toFixed(1)} µs | 1.00×, 1.00×, 1.00×, 1.00× |`,
  ]
  const poll = mainPoll(results)
  for (const [label, run] of [
    [`2. Agent poll (${int(poll?.agents ?? 0)} agents)`, poll],
    ['3. Reply', results.reply],
    ['3b. Reply to a waiting conversation', results.replyWaiting],
  ] as const) {
    if (!run) continue
    const b = baselineOf(results, run.against)
    const api = cpuUs(run, 'api')
    lines.push(
      `| ${label} | ${int(run.load.rps)} req/s | ${ms(run.load.p50)} | ${ms(run.load.p99)} | ${api.toFixed(1)} µs | ${x(run.load.rps, b.rps)}, ${x(run.load.p50, b.p50)}, ${x(run.load.p99, b.p99)}, ${x(api, b.cpuUs)} |`,
    )
  }
  const s = mainStreams(results)
  if (s)
    lines.push(
      `| 4. Streams (${int(s.opened)} open; a message's delivery to all) | — | ${ms(s.all.p50)} | ${ms(s.all.p99)} | — | peak ${mb(s.peakMb)} |`,
    )
  const i = mainInvoices(results)
  if (i)
    lines.push(
      `| 5. Invoice run (${int(i.periods)} periods) | ${int(i.first.issued / i.first.seconds)} invoices/s, ${i.first.seconds.toFixed(1)} s | — | — | — | workers peak ${mb(i.workersPeakMb)} |`,
    )
  const unsteady = [results.polls, [results.reply], [results.replyWaiting]]
    .flat()
    .filter(run => run?.against?.length && baselineOf(results, run.against).spread > spreadLimit)
  if (unsteady.length > 0) {
    lines.push(
      '',
      `**The bare route varied more than ${pct(spreadLimit)} between its rounds beside ${unsteady.length} of the scenarios (marked in their sections): this run's ratios are not steady.**`,
    )
  }
  lines.push('', '### Targets', '', '| scenario | target | measured | result |', '|---|---|---|---|')
  for (const t of targets(results)) lines.push(`| ${t.scenario} | ${t.target} | ${t.measured} | ${t.pass ? 'pass' : '**fail**'} |`)
  lines.push('')
  return lines
}

export function renderResults(results: Results): string {
  const lines = [
    ...header(results),
    ...summary(results),
    ...(results.baselines.length > 0 ? baselineSection(results) : []),
    ...pollSection(results),
    ...pollScalingSection(results),
    ...replySections(results),
    ...streamsSection(results),
    ...invoicesSection(results),
  ]
  if (results.notes.trim()) lines.push(results.notes.trim(), '')
  return lines.filter((line, i, all) => !(line === '' && all[i - 1] === '')).join('\n')
}
