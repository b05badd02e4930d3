/**
 * Check: writes succeed again within 2 s of the restarted server accepting connections: for each
 * kind of write (message, reply, proxy call, subscription), the first 2xx answer that came after that moment
 * came within 2 s of it. For an API process restarted, only the writes it answered count.
 */
import { describeAttempt, type Attempt } from './http-client.ts'
import { writeKinds, type WriteKind } from './load-driver.ts'
import { backMoment, type ScenarioRun } from './scenario-run.ts'

export const recoveryWithinMs = 2000

export interface Recovery {
  kind: WriteKind
  /** Milliseconds from the server accepting connections (or the first attempt after, if later) to the first 2xx; undefined if none came. */
  ms?: number
  /** The answers that kind got meanwhile (status or "no answer"), counted. */
  meanwhile: Record<string, number>
  /** The attempts that ended after the moment, up to the first 2xx (the first few, for a report). */
  attempts: Attempt[]
}

export function recoveries(run: ScenarioRun): Recovery[] {
  const { fault } = run
  return writeKinds.map(kind => {
    const attempts = run.load.writes
      .filter(write => write.kind === kind)
      .flatMap(write => write.attempts)
      .filter(attempt => attempt.endedAt >= fault.upAt && (fault.api === undefined || attempt.api === fault.api))
      .sort((a, b) => a.endedAt - b.endedAt)
    const first = attempts.find(attempt => attempt.status !== undefined && attempt.status >= 200 && attempt.status < 300)
    const meanwhile: Record<string, number> = {}
    for (const attempt of attempts) {
      if (first && attempt.endedAt >= first.endedAt) break
      const answer = attempt.status === undefined ? 'no answer' : `${attempt.status}${attempt.body?.error ? ` ${attempt.body.error}` : ''}`
      meanwhile[answer] = (meanwhile[answer] ?? 0) + 1
    }
    // The clock starts when the server was back and a write of this kind was asked for: a load that
    // happened not to try one for a while says nothing about the service.
    const from = Math.max(fault.upAt, attempts[0]?.startedAt ?? fault.upAt)
    return {
      kind,
      ms: first ? first.endedAt - from : undefined,
      meanwhile,
      attempts: attempts.slice(0, first ? attempts.indexOf(first) + 1 : 6).slice(0, 6),
    }
  })
}

export function checkRecovery(run: ScenarioRun): string[] {
  const through = run.fault.api === undefined ? '' : ` through api-${run.fault.api + 1}`
  return recoveries(run)
    .filter(recovery => recovery.ms === undefined || recovery.ms > recoveryWithinMs)
    .map(
      recovery =>
        `${recovery.kind}: the first 2xx${through} came ${recovery.ms === undefined ? 'never (before the load stopped)' : `${recovery.ms} ms`} after ` +
        `${backMoment(run)} (limit ${recoveryWithinMs} ms); answers before it: ${JSON.stringify(recovery.meanwhile)}; ` +
        `the attempts (times from the load's start, ${backMoment(run)} at +${run.fault.upAt - run.load.startedAt} ms): ` +
        recovery.attempts.map(attempt => describeAttempt(attempt, run.load.startedAt)).join('; '),
    )
}
