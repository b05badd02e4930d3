/** The report's load sections: the bare route, the poll, the replies; each run against the bare route of the same run. */
import { baselineOf, cores, cpuUs, mainPoll, spreadLimit, type Baseline, type Results } from './figures.ts'
import { non2xx } from './load.ts'
import { int, mb, ms, pct } from './stats.ts'
import type { LoadRun, ReplyRun } from './types.ts'

const x = (value: number, base: number) => (base > 0 ? `${(value / base).toFixed(2)}×` : 'n/a')
const processes = ['workers', 'postgres', 'redis'] as const

const loadHeader = ['| run | req/s | p50 | p99 | max | non-2xx | load avg (before → after) |', '|---|---:|---:|---:|---:|---:|---|']
function loadRow(label: string, run: LoadRun, b: Baseline): string {
  const l = run.load
  return `| ${label} | ${int(l.rps)} (${x(l.rps, b.rps)}) | ${ms(l.p50)} (${x(l.p50, b.p50)}) | ${ms(l.p99)} (${x(l.p99, b.p99)}) | ${ms(l.max)} | ${non2xx(l)} | ${run.loadavg[0].toFixed(2)} → ${run.loadavg[1].toFixed(2)} |`
}

const cpuHeader = [
  '| run | server | workers | PostgreSQL | Redis | all four | server cores | req/s per server core | generator cores |',
  '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
]
function cpuRow(label: string, run: LoadRun, b: Baseline): string {
  const us = (role: string) => `${cpuUs(run, role).toFixed(1)} µs (${x(cpuUs(run, role), b.cpuUs)})`
  const all = cpuUs(run, run.server, ...processes)
  const server = cpuUs(run, run.server)
  const generator = run.load.generatorCpuSeconds / run.wallSeconds
  return `| ${label} | ${us(run.server)} | ${processes.map(us).join(' | ')} | ${all.toFixed(1)} µs (${x(all, b.cpuUs)}) | ${cores(run, run.server).toFixed(2)} | ${int(1e6 / server)} (${x(b.cpuUs, server)}) | ${generator.toFixed(2)} |`
}

/** The load and CPU tables of a scenario: each round, then the rounds together. */
function scenarioTables(run: LoadRun, b: Baseline): string[] {
  const rounds = run.rounds ?? []
  return [
    ...loadHeader,
    ...rounds.map((round, i) => loadRow(`round ${i + 1}`, round, b)),
    loadRow('all', run, b),
    '',
    "CPU a request of each process, and its ratio to the bare route server's CPU a request:",
    '',
    ...cpuHeader,
    ...rounds.map((round, i) => cpuRow(`round ${i + 1}`, round, b)),
    cpuRow('all', run, b),
  ]
}

function against(results: Results, run: LoadRun): string[] {
  if (!run.against?.length) return []
  const b = baselineOf(results, run.against)
  const first = run.against[0]! + 1
  const last = run.against[run.against.length - 1]! + 1
  const varied =
    b.spread > spreadLimit
      ? ` **The bare route varied ${pct(b.spread)} between these runs (more than ${pct(spreadLimit)}): the machine was not steady, and these ratios are not to be trusted.**`
      : ` The bare route varied ${pct(b.spread)} between them.`
  return [`Ratios to the median of bare-route runs ${first} to ${last}, which alternated with this scenario's rounds.${varied}`, '']
}

export function baselineSection(results: Results): string[] {
  const base = baselineOf(results)
  const lines = [
    '## 1. Baseline',
    '',
    'GET / on bench/baseline-server.ts, every run of the bench; ratios to the median of all of them.',
    '',
    ...loadHeader,
    ...results.baselines.map((run, i) => loadRow(`run ${i + 1}`, run, base)),
    `| median | ${int(base.rps)} | ${ms(base.p50)} | ${ms(base.p99)} | | | |`,
    '',
    ...cpuHeader,
    ...results.baselines.map((run, i) => cpuRow(`run ${i + 1}`, run, base)),
    '',
    `Peak RSS ${mb(base.peakMb)}. Across all its runs the bare route varied ${pct(base.spread)} in requests a second.`,
    '',
  ]
  return lines
}

export function pollSection(results: Results): string[] {
  const p = mainPoll(results)
  if (!p) return []
  return [
    '## 2. Agent poll',
    '',
    `GET /v1/agent/events with ${int(p.agents)} registered agents, ${int(p.pendingAgents)} (1 %) with a pending conversation (${int(p.pendingSeen)} seen by the warm-up poll, which also built every inbox and cached every key), a random agent's X-API-Key per request, on a fresh API process. API peak RSS ${mb(p.peakMb.api ?? 0)}.`,
    '',
    ...scenarioTables(p, baselineOf(results, p.against)),
    '',
    ...against(results, p),
  ]
}

function replySection(results: Results, heading: string, r: ReplyRun, what: string): string[] {
  const c = r.perReply
  const total = c.apiUs + c.workersUs + c.postgresUs + c.redisUs
  return [
    heading,
    '',
    `${what} ${int(r.recorded)} agent messages were recorded in Postgres while ${int(r.load.statuses?.['201'] ?? 0)} replies were answered 201 (requests cut off when a round ended still land). Responses by status: ${JSON.stringify(r.load.statuses ?? {})}.`,
    '',
    ...scenarioTables(r, baselineOf(results, r.against)),
    '',
    ...against(results, r),
    "What one reply costs, all processes together (CPU over the agent messages recorded; Redis commands are every client's):",
    '',
    '| API | workers | PostgreSQL | Redis | all four | Redis commands | PostgreSQL transactions |',
    '|---:|---:|---:|---:|---:|---:|---:|',
    `| ${c.apiUs.toFixed(0)} µs | ${c.workersUs.toFixed(0)} µs | ${c.postgresUs.toFixed(0)} µs | ${c.redisUs.toFixed(0)} µs | **${total.toFixed(0)} µs** | ${c.redisCommands.toFixed(1)} | ${c.pgTransactions.toFixed(2)} |`,
    '',
  ]
}

export function replySections(results: Results): string[] {
  const lines: string[] = []
  if (results.reply) {
    lines.push(
      ...replySection(
        results,
        '## 3. Reply',
        results.reply,
        `POST /v1/agent/conversation-reply from a random one of ${int(results.reply.agents)} agents to its conversation, through the agent's actor, on a fresh API process. The seeded conversations were answered in the warm-up, so these replies find nothing pending and leave the inbox alone, as an agent's follow-ups do; 3b measures the replies that answer.`,
      ),
    )
  }
  if (results.replyWaiting) {
    const r = results.replyWaiting
    lines.push(
      ...replySection(
        results,
        '## 3b. Reply to a waiting conversation',
        r,
        `The same requests, each to a different conversation that waits for its reply: ${int(r.agents)} agents with a user's message from each of many users, every agent's inbox built in Redis (two polls each) before the run, and the conversations taken in a random order, each once (${int(r.answered ?? 0)} of them, warm-up included). So every reply also takes its conversation out of the agent's inbox and announces that to every API process, as an agent answering what it polled does.`,
      ),
    )
  }
  return lines
}
