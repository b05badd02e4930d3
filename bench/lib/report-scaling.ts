/** The report's sections on how cost grows with the work: the poll by agents, streams by count, the invoice run by periods. */
import { baselineOf, cpuUs, invoiceCpuUs, mainInvoices, mainStreams, spreadLimit, type Results } from './figures.ts'
import { int, mb, ms, pct } from './stats.ts'
import type { InvoiceRun } from './types.ts'

const x = (value: number, base: number) => (base > 0 ? `${(value / base).toFixed(2)}×` : 'n/a')
const kb = (mbValue: number, n: number) => `${((mbValue * 1024) / Math.max(1, n)).toFixed(1)} KB`

export function pollScalingSection(results: Results): string[] {
  if (results.polls.length === 0) return []
  const rows = results.polls.map((p, i) => {
    const b = baselineOf(results, p.against)
    const api = cpuUs(p, 'api')
    const grown = p.rssAfterMb - p.rssBeforeMb
    const previous = results.polls[i - 1]
    const marginal = previous ? kb(p.rssAfterMb - previous.rssAfterMb, p.agents - previous.agents) : '—'
    const varied = b.spread > spreadLimit ? `**${pct(b.spread)}**` : pct(b.spread)
    return `| ${int(p.agents)} | ${int(p.load.rps)} (${x(p.load.rps, b.rps)}) | ${ms(p.load.p50)} | ${ms(p.load.p99)} (${x(p.load.p99, b.p99)}) | ${api.toFixed(1)} µs (${x(api, b.cpuUs)}) | ${pct(b.cpuUs / api)} | ${mb(p.rssBeforeMb)} → ${mb(p.rssAfterMb)} | ${kb(grown, p.agents)} | ${marginal} | ${varied} |`
  })
  return [
    '## 2a. The poll by number of agents',
    '',
    "Each size on a fresh API process: every agent polled twice (inbox built and held in memory, key cached), then the rounds alternating with the bare route's as in section 2. Memory a cached agent: the API's RSS growth from the fresh process to the end of the rounds over the agents polled (the process's own warm-up is in it, which weighs most at the smallest size); the marginal column is the growth from the size before over the agents added.",
    '',
    '| agents | req/s (× bare) | p50 | p99 (× bare) | API CPU a request (× bare) | req/s per server core, of the bare route | API RSS, fresh → after | a cached agent | marginal | bare route varied |',
    '|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|',
    ...rows,
    '',
  ]
}

export function streamsSection(results: Results): string[] {
  const s = mainStreams(results)
  const lines: string[] = []
  if (s) {
    lines.push(
      '## 4. Streams',
      '',
      `${int(s.opened)} of ${int(s.streams)} GET /v1/events/chat streams opened on one fresh API process in ${s.openSeconds.toFixed(1)} s (raw TCP sockets from the orchestrator, each counted open at its \`retry: 3000\`). Then ${s.messages.length} chat messages, each timed from the moment its POST /v1/chat/messages was sent to its arrival on every stream. Delivery times include the orchestrator reading all the sockets in one JavaScript thread, so they are an upper bound on the server's.`,
      '',
      `API memory: ${mb(s.rssIdleMb)} RSS before the streams, ${mb(s.rssOpenMb)} with them open (${kb(s.rssOpenMb - s.rssIdleMb, s.opened)} a stream), peak ${mb(s.peakMb)}.`,
      '',
      '| message | delivered | missing | p50 | p99 | max |',
      '|---|---:|---:|---:|---:|---:|',
      ...s.messages.map((m, i) => `| ${i + 1} | ${int(m.delivered)} | ${m.missing} | ${ms(m.p50)} | ${ms(m.p99)} | ${ms(m.max)} |`),
      `| all | ${int(s.all.delivered)} | ${s.all.missing} | ${ms(s.all.p50)} | ${ms(s.all.p99)} | ${ms(s.all.max)} |`,
      '',
    )
  }
  if (results.streams.length > 0) {
    lines.push(
      '### 4a. Streams by number open',
      '',
      `Each count on a fresh API process, as above. The open-file limit was ${results.machine.openFiles} a process when the run began; the bench raises it for a count that needs more where it may (root with CAP_SYS_RESOURCE), and otherwise opens as many as fit and says so.`,
      '',
      '| streams | opened | in | API RSS, idle → open | a stream | peak | delivery to all: p50 | p99 | max | missing |',
      '|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|',
      ...results.streams.map(
        t =>
          `| ${int(t.asked)} | ${int(t.opened)}${t.streams < t.asked ? ` (limit ${int(t.openFilesLimit)} files)` : ''} | ${t.openSeconds.toFixed(1)} s | ${mb(t.rssIdleMb)} → ${mb(t.rssOpenMb)} | ${kb(t.rssOpenMb - t.rssIdleMb, t.opened)} | ${mb(t.peakMb)} | ${ms(t.all.p50)} | ${ms(t.all.p99)} | ${ms(t.all.max)} | ${t.all.missing} |`,
      ),
      '',
    )
  }
  return lines
}

/** The first run's time, or that it did not finish. */
function firstRun(run: InvoiceRun): string {
  const f = run.first
  return f.finished ? `${f.seconds.toFixed(1)} s` : `**unfinished**: ${int(f.issued)} in ${f.seconds.toFixed(0)} s`
}

export function invoicesSection(results: Results): string[] {
  const i = mainInvoices(results)
  const lines: string[] = []
  if (i) {
    const relayed = i.relaySeconds === undefined ? '' : `, which the workers' relay empties ${i.relaySeconds.toFixed(1)} s after the run`
    lines.push(
      '## 5. Invoice run',
      '',
      `${int(i.periods)} ended subscription periods with usage (10 agents' plans, ${int(i.periods / 10)} payers, 1 to 8 proxy calls each over 3 included), seeded with SQL in ${i.seedSeconds.toFixed(1)} s. The run is a job on the \`invoices\` queue, taken by the workers process; times are from enqueueing to the job's completion. The run also creates the ${int(i.periods)} current periods, as the first run after a month turns does, and writes one \`invoice.issued\` event per invoice to the outbox${relayed}.`,
      '',
      '| run | issued | time | in the worker | invoices/s |',
      '|---|---:|---:|---:|---:|',
      `| first | ${int(i.first.issued)} | ${firstRun(i)} | ${i.first.processSeconds.toFixed(1)} s | ${int(i.first.issued / i.first.seconds)} |`,
      i.second ? `| second | ${int(i.second.issued)} | ${i.second.seconds.toFixed(2)} s | | |` : '| second | not run | | | |',
      '',
      `Invoices in Postgres after both runs: ${int(i.first.counted)}; periods invoiced twice: ${i.duplicates}. The workers process peaked at ${mb(i.workersPeakMb)}.`,
      '',
    )
  }
  if (results.invoices.length > 0) {
    const per = (run: InvoiceRun, role: string) => `${(((run.cpuSeconds[role] ?? 0) * 1e6) / Math.max(1, run.first.issued)).toFixed(0)} µs`
    lines.push(
      '### 5a. The invoice run by number of periods',
      '',
      "Each size after the billing tables were emptied, seeded anew and run as above. CPU an invoice covers the first run and the relay of its events (the workers from /proc, the run's Postgres backends, Redis's own count of itself). A first run still going after 1 ms a period and 2 minutes is reported unfinished, with what it had issued, and the larger sizes are left out.",
      '',
      '| periods | seeded in | first run | µs an invoice (time) | workers peak RSS | CPU an invoice: workers | PostgreSQL | Redis | all | events relayed after | second run |',
      '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
      ...results.invoices.map(
        r =>
          `| ${int(r.periods)} | ${r.seedSeconds.toFixed(1)} s | ${firstRun(r)} | ${((r.first.seconds * 1e6) / Math.max(1, r.first.issued)).toFixed(0)} | ${mb(r.workersPeakMb)} | ${per(r, 'workers')} | ${per(r, 'postgres')} | ${per(r, 'redis')} | ${invoiceCpuUs(r).toFixed(0)} µs | ${r.relaySeconds === undefined ? '—' : `${r.relaySeconds.toFixed(1)} s`} | ${r.second ? `${r.second.issued} in ${r.second.seconds.toFixed(2)} s` : '—'} |`,
      ),
      '',
    )
  }
  return lines
}
