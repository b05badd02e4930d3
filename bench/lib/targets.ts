/** The targets of issues 9 and 25, each passed or failed by the figures of the run. */
import { baselineOf, cpuUs, invoiceCpuUs, mainInvoices, mainPoll, mainStreams, type Results } from './figures.ts'
import { int, mb, ms, pct } from './stats.ts'
import type { PollRun } from './types.ts'

export interface Target {
  scenario: string
  target: string
  measured: string
  pass: boolean
}

function pollTargets(results: Results, poll: PollRun, main: boolean): Target[] {
  const base = baselineOf(results, poll.against)
  const scenario = `Agent poll, ${int(poll.agents)} agents`
  const perCore = base.cpuUs / cpuUs(poll, 'api')
  const out: Target[] = [
    { scenario, target: '≥ 70 % of the bare route per server core', measured: pct(perCore), pass: perCore >= 0.7 },
    {
      scenario,
      target: 'p99 ≤ 2 × the bare route',
      measured: `${ms(poll.load.p99)} (${(poll.load.p99 / base.p99).toFixed(2)}×)`,
      pass: poll.load.p99 <= 2 * base.p99,
    },
  ]
  if (main) {
    out.push({ scenario, target: '≥ 70 % of the bare route req/s', measured: pct(poll.load.rps / base.rps), pass: poll.load.rps >= 0.7 * base.rps })
    out.push({ scenario, target: 'p99 < 10 ms', measured: ms(poll.load.p99), pass: poll.load.p99 < 10 })
  }
  return out
}

export function targets(results: Results): Target[] {
  const out: Target[] = []
  const poll = mainPoll(results)
  if (poll) out.push(...pollTargets(results, poll, true))
  for (const other of results.polls) if (other.agents >= 100_000 && other !== poll) out.push(...pollTargets(results, other, false))
  for (const [scenario, run] of [
    ['Reply', results.reply],
    ['Reply to a waiting conversation', results.replyWaiting],
  ] as const) {
    if (!run) continue
    const base = baselineOf(results, run.against)
    out.push({ scenario, target: '≥ 25 % of the bare route req/s', measured: pct(run.load.rps / base.rps), pass: run.load.rps >= 0.25 * base.rps })
  }
  if (results.replyWaiting) {
    const c = results.replyWaiting.perReply
    const total = c.apiUs + c.postgresUs + c.redisUs
    out.push({
      scenario: 'Reply to a waiting conversation',
      target: '≤ 100 µs CPU a reply, API + Postgres + Redis',
      measured: `${total.toFixed(0)} µs (${c.workersUs.toFixed(0)} µs more in the workers)`,
      pass: total <= 100,
    })
  }
  const streams = mainStreams(results)
  if (streams) {
    out.push({
      scenario: 'Streams',
      target: `${int(streams.asked)} streams in < 300 MB`,
      measured: `${int(streams.opened)} open, peak ${mb(streams.peakMb)}`,
      pass: streams.opened === streams.asked && streams.peakMb < 300,
    })
  }
  for (const s of results.streams) {
    const worst = Math.max(...s.messages.map(m => m.p99))
    out.push({
      scenario: `Streams, ${int(s.asked)}`,
      target: 'all open on one process, every stream within 1 s at p99',
      measured: `${int(s.opened)} open${s.streams < s.asked ? ` (open-file limit ${int(s.openFilesLimit)})` : ''}, worst message p99 ${ms(worst)}, ${s.all.missing} missing`,
      pass: worst < 1000 && s.all.missing === 0 && s.opened === s.asked,
    })
  }
  const invoices = mainInvoices(results)
  if (invoices) {
    out.push({
      scenario: 'Invoice run',
      target: `${int(invoices.periods)} periods in < 30 s`,
      measured: `${int(invoices.first.issued)} in ${invoices.first.seconds.toFixed(1)} s`,
      pass: invoices.first.issued === invoices.periods && invoices.first.seconds < 30,
    })
  }
  for (const i of results.invoices) {
    out.push({
      scenario: `Invoice run, ${int(i.periods)}`,
      target: 'issues every period; a second run issues 0; none twice',
      measured: i.second
        ? `${int(i.first.issued)} of ${int(i.periods)}; ${i.second.issued}, ${i.duplicates} twice`
        : `unfinished after ${i.first.seconds.toFixed(0)} s (${int(i.first.issued)} issued)`,
      pass: i.first.finished && i.first.issued === i.periods && i.second?.issued === 0 && i.duplicates === 0,
    })
  }
  const [smallest, largest] = [results.invoices[0], results.invoices[results.invoices.length - 1]]
  if (smallest && largest && largest !== smallest) {
    const ratio = invoiceCpuUs(largest) / invoiceCpuUs(smallest)
    out.push({
      scenario: 'Invoice run',
      target: `CPU an invoice at ${int(largest.periods)} ≤ 1.25 × at ${int(smallest.periods)} (does not grow with the run)`,
      measured: `${invoiceCpuUs(largest).toFixed(0)} µs against ${invoiceCpuUs(smallest).toFixed(0)} µs (${ratio.toFixed(2)}×)`,
      pass: ratio <= 1.25,
    })
  }
  return out
}
