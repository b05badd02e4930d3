/** Logging: one JSON line per record on stdout, filtered by level. Never given secrets or query strings. */

const levels = { debug: 10, info: 20, warn: 30, error: 40 } as const
export type LogLevel = keyof typeof levels

export interface Log {
  debug(msg: string, fields?: Record<string, unknown>): void
  info(msg: string, fields?: Record<string, unknown>): void
  warn(msg: string, fields?: Record<string, unknown>): void
  error(msg: string, fields?: Record<string, unknown>): void
}

export function createLog(level: LogLevel, write: (line: string) => void = line => console.log(line)): Log {
  const min = levels[level]
  const emit = (at: LogLevel) => (msg: string, fields?: Record<string, unknown>) => {
    if (levels[at] < min) return
    write(JSON.stringify({ time: new Date().toISOString(), level: at, msg, ...fields }))
  }
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') }
}

export function errorFields(error: unknown): Record<string, unknown> {
  if (error instanceof Error) return { error: error.message, stack: error.stack }
  return { error: String(error) }
}
