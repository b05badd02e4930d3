/** Check: no service process exited unless the scenario killed it on purpose. */
import { lastProblems } from './log-lines.ts'
import type { ScenarioRun } from './scenario-run.ts'
import { running, tail } from './service-process.ts'

export function checkProcesses(run: ScenarioRun): string[] {
  const failures: string[] = []
  for (const service of run.deployment.all) {
    if (running(service) || service.killedOnPurpose) continue
    const how = service.proc.signalCode ? `signal ${service.proc.signalCode}` : `code ${service.proc.exitCode}`
    failures.push(
      [
        `${service.name} (pid ${service.proc.pid}) exited unexpectedly with ${how}.`,
        `  stderr (last lines):\n${indent(tail(service.stderr(), 15) || '(empty)')}`,
        `  last warnings and errors logged:\n${indent(lastProblems(service, 5).join('\n') || '(none)')}`,
        `  full output: ${run.deployment.logDir}/${service.name}.log`,
      ].join('\n'),
    )
  }
  return failures
}

export function indent(text: string, by = '    '): string {
  return text
    .split('\n')
    .map(line => by + line)
    .join('\n')
}
