/** Logging: one JSON line per record on stdout, filtered by level. Never given secrets or query strings. */
import { format } from 'node:util'

const levels = { debug: 10, info: 20, warn: 30, error: 40 } as const
export type LogLevel = keyof typeof levels

export interface Log {
  debug(msg: string, fields?: Record<string, unknown>): void
  info(msg: string, fields?: Record<string, unknown>): void
  warn(msg: string, fields?: Record<string, unknown>): void
  error(msg: string, fields?: Record<string, unknown>): void
}

// The console's own writer, kept before `captureConsole` routes the console through a log.
const consoleError = console.error.bind(console)

/** Writes a line to stderr, whatever `captureConsole` did to the console (the line of a failed boot or a crash). */
export const toStderr = (line: string) => consoleError(line)

/** What stdout may hold unwritten while its reader is behind, before lines are dropped. */
export const stdoutBacklogBytes = 1024 * 1024

/**
 * Writes lines to `stream` without ever blocking the process. The console writes to a pipe in place,
 * so a reader that stopped reading (a stalled log collector) froze the whole process once the pipe
 * was full: every request, the health probes, SIGTERM. Here a reader behind by more than
 * `backlogBytes` costs lines instead: they are dropped, counted, and said once it catches up.
 */
export function backlogWriter(stream: NodeJS.WritableStream, backlogBytes = stdoutBacklogBytes) {
  // Bytes handed over since `write` last said the stream was behind (none while it keeps up).
  let backlog = 0
  let behind = false
  let dropped = 0
  // A reader that went away (EPIPE: a `| head`, a collector restarted; EIO: a closed terminal) takes
  // the log with it, nothing else. Unheard, Bun turned the error into an unhandled rejection: a crash
  // in a process without a handler, a record lost on the same stdout and an exit held 1 s in ours.
  let gone = false
  stream.on('error', () => (gone = true))
  const write = (line: string) => {
    if (gone) return
    if (behind && backlog + line.length > backlogBytes) {
      dropped++
      return
    }
    if (behind) backlog += line.length + 1
    if (!stream.write(`${line}\n`)) behind = true
  }
  stream.on('drain', () => {
    behind = false
    backlog = 0
    if (dropped === 0) return
    const count = dropped
    dropped = 0
    createLog('warn', write).warn('log lines dropped: stdout was not being read', { dropped: count })
  })
  /** Resolves once the stream has written out what it was given, or its reader is gone, or after `ms` (a reader that stopped). */
  const flushed = (ms: number): Promise<unknown> =>
    behind && !gone
      ? Promise.race([new Promise(resolve => (stream.once('drain', resolve), stream.once('error', resolve))), Bun.sleep(ms)])
      : Promise.resolve()
  return Object.assign(write, { flushed })
}

const stdout = backlogWriter(process.stdout)

/** Writes a line to stdout (never blocking: see backlogWriter). */
export const toStdout = (line: string) => stdout(line)

/**
 * Waits (at most `ms`) for stdout to write out what it holds: process.exit drops it otherwise, and
 * with it the records of a shutdown whose reader was behind.
 */
export const stdoutFlushed = (ms: number) => stdout.flushed(ms)

export function createLog(level: LogLevel, write: (line: string) => void = toStdout): Log {
  const min = levels[level]
  const emit = (at: LogLevel) => (msg: string, fields?: Record<string, unknown>) => {
    if (levels[at] < min) return
    write(boundedLine({ time: new Date().toISOString(), level: at, msg, ...fields }))
  }
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') }
}

/**
 * The longest line the log writes, in bytes with its newline. Docker's json-file driver and CRI
 * runtimes (containerd, CRI-O) split longer lines into pieces of 16 KiB, which a collector parsing
 * each as JSON (Vector, Fluent Bit, Loki, CloudWatch) takes as broken lines; and a field that grows
 * with what a caller sent or a server said (an error's message, a library's output, a database's
 * log) would otherwise be as long as that.
 */
export const maxLineBytes = 16 * 1024

/**
 * The record as one JSON line of at most `maxLineBytes`: when longer, its strings are cut (each
 * saying how long it was) to 4096 characters, then to 256 and its arrays to 20 items; a record still
 * over keeps its time, level and message (cut to 256) and says how long it was in `cutFromBytes`.
 */
function boundedLine(record: { time: string; level: LogLevel; msg: string } & Record<string, unknown>): string {
  const line = JSON.stringify(record)
  // A UTF-16 unit is at most 3 bytes in UTF-8 (a pair, 4), and JSON's escapes are ASCII.
  if (line.length * 3 < maxLineBytes || Buffer.byteLength(line) < maxLineBytes) return line
  for (const [chars, items] of [
    [4096, Infinity],
    [256, 20],
  ] as const) {
    const shorter = JSON.stringify(record, (_, value) => cut(value, chars, items))
    if (Buffer.byteLength(shorter) < maxLineBytes) return shorter
  }
  return JSON.stringify({ time: record.time, level: record.level, msg: cut(record.msg, 256, 0), cutFromBytes: Buffer.byteLength(line) })
}

function cut(value: unknown, chars: number, items: number): unknown {
  if (typeof value === 'string' && value.length > chars) {
    // Not between the two halves of a surrogate pair.
    const end = /[\uD800-\uDBFF]/.test(value[chars - 1]!) ? chars - 1 : chars
    return `${value.slice(0, end)}… (cut from ${value.length} characters)`
  }
  if (Array.isArray(value) && value.length > items) return [...value.slice(0, items), `… (cut from ${value.length} items)`]
  return value
}

/** An error as log fields: its message, its code when it has one (a SQLSTATE, an errno name), its stack. */
export function errorFields(error: unknown): Record<string, unknown> {
  if (!(error instanceof Error)) return { error: String(error) }
  const code = (error as { code?: unknown }).code
  return typeof code === 'string' ? { error: error.message, code, stack: error.stack } : { error: error.message, stack: error.stack }
}

/**
 * Makes what libraries print with `console.*` (BullMQ's warnings about Redis's version or eviction
 * policy, its last-resort `console.error`) records of `log`, so that every line the process writes is
 * one JSON object. For the service's process only: tests keep their console.
 */
export function captureConsole(log: Log): void {
  const as =
    (at: LogLevel) =>
    (...args: unknown[]) =>
      log[at]('console output', { text: format(...args) })
  console.log = console.info = as('info')
  console.debug = console.trace = as('debug')
  console.warn = as('warn')
  console.error = as('error')
}

/** Writes a record of `key` unless one was written within the window (`throttled`). */
export type Throttled = (at: LogLevel, key: string, msg: string, fields?: Record<string, unknown>) => void

/**
 * A log for what can repeat without end while something is down (every request failing alike, every
 * reconnection attempt): the first record of each key is written, then at most one a `windowMs`,
 * carrying how many were held back since the last. Timed by the monotonic clock: a wall clock stepped
 * back would hold records back for as long.
 */
export function throttled(log: Log, windowMs: number, now: () => number = () => performance.now()): Throttled {
  const last = new Map<string, { at: number; held: number }>()
  return (at: LogLevel, key: string, msg: string, fields: Record<string, unknown> = {}) => {
    const time = now()
    const seen = last.get(key)
    if (seen && time - seen.at < windowMs) {
      seen.held++
      return
    }
    // Keys are few (a message per kind of failure), but never let them grow without bound.
    if (!seen && last.size >= 1000) last.clear()
    last.set(key, { at: time, held: 0 })
    log[at](msg, seen?.held ? { ...fields, heldBack: seen.held } : fields)
  }
}
