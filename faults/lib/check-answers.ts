/**
 * Check: every answer the load got is one a client can live with: a 2xx; a 503 (the write is retried
 * under its key; how soon writes succeed again is the recovery check's business); a 409
 * `idempotency_key_in_progress` to a retry; no answer only from an API process the scenario killed,
 * before its replacement was up. And no write was left unacknowledged by a service still answering
 * 503 (or nothing) after `giveUpAfterMs` of retries.
 */
import { describeAttempt, type Attempt } from './http-client.ts'
import { giveUpAfterMs, type WriteRecord } from './load-driver.ts'
import { phase, type ScenarioRun } from './scenario-run.ts'

function allowed(run: ScenarioRun, attempt: Attempt): boolean {
  if (attempt.status !== undefined) {
    if (attempt.status >= 200 && attempt.status < 300) return true
    if (attempt.status === 503) return true
    return attempt.status === 409 && attempt.body?.error === 'idempotency_key_in_progress' && attempt.key !== undefined
  }
  // A connection refused or cut by the API process killed on purpose, until its replacement answered.
  const { fault } = run
  return (
    fault.api === attempt.api && attempt.startedAt <= fault.upAt && attempt.endedAt >= fault.downAt - 50 && !attempt.error?.startsWith('no answer')
  )
}

/** What an answer was, in a few words: `500 internal_error`, `ECONNREFUSED`, `no answer within 15000 ms`. */
function answerClass(attempt: Attempt): string {
  if (attempt.status !== undefined) return `${attempt.status}${attempt.body?.error ? ` ${attempt.body.error}` : ''}`
  return attempt.error?.split(':')[0] ?? 'no answer'
}

export function checkAnswers(run: ScenarioRun): string[] {
  const since = run.load.startedAt
  const owner = new Map<Attempt, WriteRecord>()
  for (const write of run.load.writes) for (const attempt of write.attempts) owner.set(attempt, write)
  const all = [...run.load.writes.flatMap(write => write.attempts), ...run.load.polls].sort((a, b) => a.startedAt - b.startedAt)
  // Grouped by answer and process, so a process that died makes one line, not a thousand.
  const groups = new Map<string, Attempt[]>()
  for (const attempt of all) {
    if (allowed(run, attempt)) continue
    const group = `${answerClass(attempt)} from api-${attempt.api + 1}`
    groups.set(group, [...(groups.get(group) ?? []), attempt])
  }
  const failures: string[] = []
  for (const [group, attempts] of groups) {
    const first = attempts[0]!
    const last = attempts.at(-1)!
    const examples = attempts.slice(0, 3).map(attempt => {
      const write = owner.get(attempt)
      const detail = attempt.body && typeof attempt.body === 'object' ? ` ${JSON.stringify(attempt.body).slice(0, 200)}` : ''
      return `${write ? `${write.kind} ${write.key}` : attempt.kind}: ${describeAttempt(attempt, since)}${detail}`
    })
    failures.push(
      `${attempts.length} answers ${group}, from +${first.startedAt - since} ms (${phase(run, first.startedAt)}) ` +
        `to +${last.startedAt - since} ms (${phase(run, last.startedAt)}); the first: ${examples.join('; ')}`,
    )
  }
  const stalled = run.load.writes.filter(write => write.unacked === 'gave up' && write.attempts.at(-1)!.status !== 409)
  if (stalled.length > 0) {
    failures.push(
      `${stalled.length} writes never acknowledged after ${giveUpAfterMs / 1000} s of retries under their keys: ` +
        stalled
          .map(write => `${write.kind} ${write.key} (${write.attempts.length} attempts, the last ${answerClass(write.attempts.at(-1)!)})`)
          .join(', '),
    )
  }
  return failures
}

/** Writes given up while their key was still in progress (a 409 to every retry): worth a note, not a failure. */
export function keysStuckInProgress(run: ScenarioRun): WriteRecord[] {
  return run.load.writes.filter(write => write.unacked === 'gave up' && write.attempts.at(-1)?.status === 409)
}
