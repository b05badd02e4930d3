/** The summary a scenario prints after its run: the fault's times, the load's answers, recovery, and what the processes logged. */
import { keysStuckInProgress } from './check-answers.ts'
import { recoveries } from './check-recovery.ts'
import { giveUpAfterMs, writeKinds } from './load-driver.ts'
import { problemCounts } from './log-lines.ts'
import { backMoment, type ScenarioRun } from './scenario-run.ts'

export function summary(run: ScenarioRun): string {
  const { fault, load } = run
  const lines = [`── ${run.name}: ${fault.label}`]
  lines.push(`   ${fault.restarted} down at +${fault.downAt - load.startedAt} ms, back after ${fault.upAt - fault.downAt} ms`)
  for (const kind of writeKinds) {
    const writes = load.writes.filter(write => write.kind === kind)
    const answers: Record<string, number> = {}
    for (const attempt of writes.flatMap(write => write.attempts)) {
      const answer = attempt.status === undefined ? 'no answer' : String(attempt.status)
      answers[answer] = (answers[answer] ?? 0) + 1
    }
    const acked = writes.filter(write => write.acked).length
    lines.push(`   ${kind}: ${writes.length} keys, ${acked} acknowledged; answers ${JSON.stringify(answers)}`)
  }
  const polls: Record<string, number> = {}
  for (const poll of load.polls) polls[poll.status ?? 'no answer'] = (polls[poll.status ?? 'no answer'] ?? 0) + 1
  lines.push(`   agent polls and sign-ins: ${JSON.stringify(polls)}`)
  lines.push(
    `   first 2xx after ${backMoment(run)}${fault.api === undefined ? '' : ` (through api-${fault.api + 1})`}: ` +
      recoveries(run)
        .map(r => `${r.kind} ${r.ms === undefined ? 'none' : `${r.ms} ms`}`)
        .join(', '),
  )
  lines.push(
    `   job schedulers back: ${run.schedulersBackAt === undefined ? `no (${run.schedulersSeen})` : `${Math.max(0, run.schedulersBackAt - fault.upAt)} ms after`}`,
  )
  const cuts = [...run.streams.values()].reduce((sum, stream) => sum + stream.connections.length - 1, 0)
  lines.push(`   event streams: ${run.streams.size}, reconnected ${cuts} times in all`)
  for (const service of run.deployment.all) {
    const counts = problemCounts(service)
    if (Object.keys(counts).length > 0) lines.push(`   ${service.name} logged ${JSON.stringify(counts)}`)
  }
  const stuck = keysStuckInProgress(run)
  if (stuck.length > 0)
    lines.push(`   note: keys still "in progress" after ${giveUpAfterMs / 1000} s of retries (given up): ${stuck.map(write => write.key).join(', ')}`)
  const refused = load.writes.filter(write => write.unacked === 'refused')
  for (const write of refused) {
    const last = write.attempts.at(-1)!
    lines.push(
      `   refused: ${write.kind} ${write.key}, answers ${write.attempts.map(a => a.status ?? 'no answer').join(' ')}; the last ${JSON.stringify(last.body).slice(0, 160)}`,
    )
  }
  return lines.join('\n')
}
