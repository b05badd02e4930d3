/** Reading the service's JSON log lines: warnings and errors counted by message, and the last ones. */
import type { ServiceProcess } from './service-process.ts'

interface LogRecord {
  time?: string
  level?: string
  msg?: string
  error?: string
  [field: string]: unknown
}

function parse(line: string): LogRecord | undefined {
  try {
    return JSON.parse(line) as LogRecord
  } catch {
    return undefined
  }
}

/** Warnings and errors of a process, counted by message: `{ "event not published": 14 }`. */
export function problemCounts(service: ServiceProcess): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const line of service.stdoutLines) {
    const record = parse(line)
    if (!record || (record.level !== 'warn' && record.level !== 'error')) continue
    const name = `${record.level}: ${record.msg}`
    counts[name] = (counts[name] ?? 0) + 1
  }
  return counts
}

/** The last warnings and errors of a process, one line each, without stacks. */
export function lastProblems(service: ServiceProcess, count: number): string[] {
  const lines: string[] = []
  for (const line of service.stdoutLines) {
    const record = parse(line)
    if (!record || (record.level !== 'warn' && record.level !== 'error')) continue
    const { stack: _stack, ...fields } = record
    lines.push(JSON.stringify(fields).slice(0, 400))
  }
  return lines.slice(-count)
}

/** How many lines of a process carry a message. */
export function countMessage(service: ServiceProcess, msg: string): number {
  return service.stdoutLines.filter(line => parse(line)?.msg === msg).length
}
