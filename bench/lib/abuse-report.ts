/** The abuse bench's report: one row per phase, the well-behaved agents' timings beside the attacker's answers and the memory. */
import type { AttackResult, Vector } from './abuse-attacker.ts'
import type { MemoryFigures } from './abuse-memory.ts'
import { requestKinds, type KindFigures, type RequestKind } from './abuse-recorder.ts'
import { int, ms } from './stats.ts'

export interface PhaseResult {
  name: 'baseline' | Vector
  /** The phase's length as measured (the attacker's first request to its last answer). */
  seconds: number
  wellBehaved: Record<RequestKind, KindFigures>
  attack: AttackResult | null
  memory: MemoryFigures
}

export interface AbuseRun {
  date: Date
  cores: number
  pinned: boolean
  settings: { seconds: number; concurrency: number; agents: number; pollMs: number; messageEveryMs: [number, number]; upstreamDelayMs: number }
  phases: PhaseResult[]
  totalSeconds: number
}

export function describePhase(name: PhaseResult['name'], upstreamDelayMs: number): string {
  switch (name) {
    case 'baseline':
      return 'no attacker'
    case 'service-requests':
      return 'service requests of 50,000 characters from one agent to one well-behaved agent'
    case 'device-polls':
      return 'polls of random device codes, no credential'
    case 'device-guesses':
      return 'approvals of random user codes by one user'
    case 'proxy-calls':
      return `proxy calls by one agent to an upstream answering 1 MiB after ${upstreamDelayMs} ms`
    case 'messages':
      return 'messages of 10,000 characters from one user to one well-behaved agent'
    case 'replies':
      return 'replies of 10,000 characters by one agent, every other one to a user who unsubscribed'
    case 'agent-creation':
      return 'agent registrations by one user'
  }
}

const statuses = (counts: Record<string, number>) =>
  Object.entries(counts)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([status, n]) => `${status}: ${int(n)}`)
    .join(', ') || 'none'

const errors = (figures: Record<RequestKind, KindFigures>) =>
  requestKinds.flatMap(kind => Object.entries(figures[kind].errors).map(([status, n]) => `${kind} ${status}: ${int(n)}`)).join(', ') || 'none'

const mbFigure = (value: number) => (value >= 10 ? value.toFixed(0) : value.toFixed(1))
const beforeDuring = (before: number, during: number) => `${mbFigure(before)} → ${mbFigure(during)}`
const timing = (figures: KindFigures) => (figures.requests === 0 ? '–' : `${ms(figures.p50)} / ${ms(figures.p99)}`)
const count = (figures: KindFigures) => (figures.requests === 0 ? '0' : `${int(figures.requests)} (p99 ${ms(figures.p99)})`)

export function renderAbuse(run: AbuseRun): string {
  const s = run.settings
  const lines = [
    '# Abuse bench',
    '',
    `${run.date.toISOString()}; ${run.cores} cores${run.pinned ? ', the API on core 1, the bench and its attacker on core 0' : ', nothing pinned (no taskset)'}; ` +
      `${Math.round(run.totalSeconds)} s in all.`,
    '',
    `${s.agents} well-behaved agents poll their events every ${s.pollMs} ms and answer what they find; each one's subscriber ` +
      `writes to it every ${s.messageEveryMs[0] / 1000} to ${s.messageEveryMs[1] / 1000} s. Then, for ${s.seconds} s a phase, one ` +
      `attacker sends on one vector with ${s.concurrency} requests at once, each as soon as the last is answered (no attacker ` +
      'in the baseline). The service runs with its default limits. Timings are client-side, of the requests begun within the phase.',
    '',
    '| phase | attacker req/s | attacker’s answers | poll p50 / p99 | reply p50 / p99 | well-behaved errors | API RSS MB, before → peak | Redis used_memory MB, before → peak | run’s Redis keys MB, before → end |',
    '|---|--:|---|--:|--:|---|--:|--:|--:|',
  ]
  for (const phase of run.phases) {
    const m = phase.memory
    const rate = phase.attack ? int(phase.attack.requests / phase.seconds) : '–'
    lines.push(
      `| ${phase.name} | ${rate} | ${phase.attack ? statuses(phase.attack.statuses) : '–'} | ${timing(phase.wellBehaved.poll)} | ` +
        `${timing(phase.wellBehaved.reply)} | ${errors(phase.wellBehaved)} | ${beforeDuring(m.apiBeforeMb, m.apiPeakMb)} | ` +
        `${beforeDuring(m.redisBeforeMb, m.redisPeakMb)} | ${beforeDuring(m.keysBefore.mb, m.keysAfter.mb)} (${int(m.keysAfter.keys)} keys) |`,
    )
  }
  lines.push('', 'The phases:', '')
  for (const phase of run.phases) lines.push(`- **${phase.name}**: ${describePhase(phase.name, s.upstreamDelayMs)}.`)
  lines.push(
    '',
    'The well-behaved requests of each phase (how many, and their p99): polls, replies to conversations, responses to service ' +
      'requests (the target of the service-request flood answers them), and the subscribers’ messages.',
    '',
    '| phase | polls | replies | responses | messages |',
    '|---|--:|--:|--:|--:|',
  )
  for (const phase of run.phases) {
    const w = phase.wellBehaved
    lines.push(`| ${phase.name} | ${count(w.poll)} | ${count(w.reply)} | ${count(w.respond)} | ${count(w.message)} |`)
  }
  lines.push(
    '',
    'Redis’s used_memory is the whole server’s, every client’s keys included; the run’s own keys (its prefix) are summed with ' +
      '`MEMORY USAGE` before the phase and as it ends.',
  )
  return lines.join('\n')
}
