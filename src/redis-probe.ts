/**
 * Replacing Redis connections that can no longer serve: those that stay open but stopped answering
 * (half-open: a proxy that stopped forwarding, a NAT that forgot the flow, a host gone without a
 * word), and those a failover left on the old primary, now a replica. Nothing else would notice the
 * first: ioredis times a command out but keeps the connection, so every later command queues behind
 * on it; BullMQ's commands have no timeout; a subscriber sends nothing once subscribed. And asking
 * Redis why it cuts new connections off.
 */
import { connect as netConnect } from 'node:net'
import { connect as tlsConnect } from 'node:tls'
import { Command, type Redis } from 'ioredis'
import { throttled, type Log } from './log.ts'

/** How often a ready connection with no probe outstanding sends one. */
const probeEveryMs = 1000

/**
 * How long a PING may go unanswered on a connection whose commands have no timeout (BullMQ's, which
 * wait for Redis; the actors' doorbell) before it is replaced, which may send their commands in
 * flight again: twice Redis's own limit on a script (`busy-reply-threshold`, 5 s), past which it
 * answers BUSY, so a Redis only slowed (a long script, a fork) is waited for.
 */
const patientDeadlineMs = 10_000

/**
 * Every second a ready connection sends a PING (valid in subscriber mode too), unless one is
 * outstanding. One unanswered for the connection's command timeout (`patientDeadlineMs` without one),
 * plus the waits of the blocking commands sent before it (Redis answers in order: a BLPOP of 1 s
 * delays it by as much), drops the connection, which reconnects as from any lost one: its commands
 * in flight fail, or go out again where the connection resends them (BullMQ's, the subscriber's:
 * redis.ts), it subscribes again, and the 'ready' that follows runs pub/sub's reconnect handlers
 * (src/pubsub.ts).
 */
export function replaceWhenDead(redis: Redis, log: Log) {
  let timer: ReturnType<typeof setInterval> | undefined
  let outstanding: object | null = null
  const probe = () => {
    if (outstanding !== null || redis.status !== 'ready') return
    const waitMs = (redis.options.commandTimeout ?? patientDeadlineMs) + blockedAhead(redis)
    if (waitMs === Infinity) return
    const self = (outstanding = {})
    const stream = redis.stream
    const deadline = setTimeout(() => {
      if (outstanding !== self) return
      outstanding = null
      // Closed meanwhile: already being replaced.
      if (stream.destroyed) return
      log.warn('redis connection stopped answering; reconnecting', { connection: redis.options.connectionName, waitedMs: waitMs })
      // Not `disconnect(true)`: its graceful close waits 2 s for a peer that will never answer.
      stream.destroy()
    }, waitMs)
    const answered = () => {
      clearTimeout(deadline)
      if (outstanding === self) outstanding = null
    }
    // A command timeout is no answer (the deadline judges); a reply, even an error, is one.
    redis.ping().then(answered, (error: Error) => void (error.message === 'Command timed out' || answered()))
  }
  redis.on('ready', () => {
    timer ??= setInterval(probe, probeEveryMs)
    timer.unref()
  })
  redis.on('end', () => {
    clearInterval(timer)
    timer = undefined
  })
}

/**
 * How long Redis may hold a command sent now behind the blocking commands in flight on the
 * connection: the sum of their own waits, Infinity behind one that waits for ever. One that ioredis
 * already settled (its `blockingTimeout`) is over, or the connection is dead. Reads ioredis's command
 * queue, which its type definitions declare but its documentation does not.
 */
function blockedAhead(redis: Redis): number {
  let ms = 0
  for (const { command } of redis.commandQueue.toArray()) {
    if (!(command instanceof Command) || command.isResolved || !Command.checkFlag('BLOCKING_COMMANDS', command.name)) continue
    // Milliseconds; 0 for ever, undefined unreadable; null not blocking (XREAD without BLOCK).
    const wait = command.extractBlockingTimeout()
    if (wait === null) continue
    ms += wait === undefined || wait === 0 ? Infinity : wait
  }
  return ms
}

/** A connection refused READONLY reconnects at most this often, however many of its commands are refused. */
const readOnlyReconnectEveryMs = 2000

/**
 * After a failover the old primary, now a replica, refuses writes (READONLY) on the connections it
 * still holds: each reconnects, through the name that now leads to the new primary. At most once
 * every 2 s a connection, so that while the name still leads to the old one, each refused write does
 * not cut the connection's other commands short again.
 */
export function reconnectWhenReadOnly(redis: Redis, log: Log) {
  const write = throttled(log, 60_000)
  let lastAt = -Infinity
  return (error: Error) => {
    if (!error.message.startsWith('READONLY ') || performance.now() - lastAt < readOnlyReconnectEveryMs) return false
    lastAt = performance.now()
    write('warn', 'readonly', 'redis connection refused writes (a replica: failover?); reconnecting', { connection: redis.options.connectionName })
    return true
  }
}

/**
 * Whether a connection failed as one Redis cut off as it was made: a client that writes at once (as
 * ioredis does) meets the close, and never reads the refusal Redis sent first.
 */
export function isCutOff(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return code === 'EPIPE' || code === 'ECONNRESET'
}

/**
 * What Redis says to a new connection that sends nothing: a refusal it writes as it accepts one and
 * then closes (`ERR max number of clients reached` at `maxclients`, `DENIED ...` in protected mode),
 * or null (it said nothing within `ms`, or the connection failed). Made as the connection's own are
 * (host, port, TLS options), on a socket of its own.
 */
export function refusalOnConnect(redis: Redis, ms = 1000): Promise<string | null> {
  const { host = '127.0.0.1', port = 6379, tls } = redis.options
  return new Promise(resolve => {
    const socket = tls ? tlsConnect({ host, port, servername: host, ...tls }) : netConnect({ host, port })
    let text = ''
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      const line = text.split('\r\n')[0]!
      resolve(line.startsWith('-') ? line.slice(1) : null)
    }
    const timer = setTimeout(done, ms)
    socket.setEncoding('utf8')
    socket.on('data', (chunk: string) => {
      text += chunk
      if (text.includes('\r\n') || text.length > 1000) done()
    })
    socket.on('error', done)
    socket.on('close', done)
  })
}
