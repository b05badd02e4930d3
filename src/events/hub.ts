/**
 * The process's SSE connections. One pub/sub subscription feeds them all; a reconnect with a last
 * event id replays from the Redis Stream, then goes live with no gap and no repeat at the seam, and so
 * does every open stream when the subscription comes back after a drop.
 */
import { randomUUID } from 'node:crypto'
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { PubSub } from '../pubsub.ts'
import type { Log } from '../log.ts'
import { errors } from '../errors.ts'
import { noStore } from '../http/caching.ts'
import { errorFields } from '../log.ts'
import type { Published } from './relay.ts'
import { createCatchUp, frame } from './catch-up.ts'
import { createConnections, type Connection } from './connections.ts'

/**
 * The headers of an event stream's response (and of a HEAD's, which opens none): stored by no cache,
 * as every private answer (http/caching.ts), and left as it is by proxies (`no-transform`: not
 * compressed, so not held back). The connection closes as the stream ends: its idle timeout was
 * lifted for the stream (events/routes.ts), and would stay lifted for a connection kept alive.
 */
export const streamHeaders = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': `${noStore}, no-transform`,
  connection: 'close',
  'x-accel-buffering': 'no',
}
export const maxStreamsPerUser = 5
// The contract's "a `: ping` at least every 5 s", with a second to spare for a busy event loop.
export const pingEveryMs = 4000
// An open stream's place in its subject's count lapses this long after its last ping (a process gone).
const placeLapseMs = 15_000
const openStreamsTtlMs = 60_000
const encoder = new TextEncoder()

// KEYS[1] the subject's open streams (id -> last heartbeat); ARGV now, stale-before, id, max.
const openStream = defineScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ${openStreamsTtlMs})
return 1`)

export interface OpenOptions {
  stream: string
  lastEventId?: string | null
  /** Counts the stream against a subject's limit of open streams (a user's, an address's). */
  limit?: { subject: string; max: number }
  /** The API key (its hex hash) the stream is opened with: revoking the key ends the stream. */
  keyHash?: string | null
  /** What a resume's replay is counted against (a user's, an address's): not asked of an open without a last event id. */
  replayBudget?: ReplayBudget
}

/**
 * Events replayed to a subject's resumed streams, which a loop of opens from far back would make
 * Redis read, and the process send, again and again (up to the 1,000 events a stream keeps, each time).
 */
export interface ReplayBudget {
  /** Refuses (429) a resume while nothing is left, before anything is read. */
  check(): Promise<void>
  /** Counts the events a resume was sent. */
  spend(events: number): Promise<void>
}

export interface EventHub {
  open(options: OpenOptions): Promise<Response>
  /** Ends every stream (shutdown), so clients reconnect elsewhere. */
  closeAll(): void
  readonly size: number
  close(): Promise<void>
}

/**
 * Whether a client's last event id could be one a stream gave: `<ms>-<seq>`, from no later than an
 * hour ahead. Ids are Redis's wall-clock time, so the wall clock (not the app's clock, which tests
 * move) is the measure, and an hour covers Redis's running ahead of this host; a resume from further
 * ahead would wait, silent, until then.
 */
export function isEventId(id: string): boolean {
  return /^\d{1,16}-\d{1,16}$/.test(id) && Number(id.slice(0, id.indexOf('-'))) <= Date.now() + 3_600_000
}

export interface EventHubOptions {
  redis: Redis
  pubsub: PubSub
  keys: Keys
  log: Log
  /** Whether an API key (its hex hash) is still live: checked as a stream opened with one starts, and after Redis reconnects. */
  isKeyLive?: (keyHash: string) => Promise<boolean>
}

export async function createEventHub(options: EventHubOptions): Promise<EventHub> {
  const { redis, pubsub, keys, log, isKeyLive } = options
  const connections = createConnections(redis)
  const { send, end } = connections

  const { deliver, ...catchUp } = createCatchUp(redis, send)

  // Listening starts with the first stream: a process that never serves one (a worker) gets no events.
  const events = pubsub.listener(keys.channels.events, message => {
    const event = JSON.parse(message) as Published
    const set = connections.ofStream(event.stream)
    if (!set) return
    const bytes = frame(event)
    // Between a drop of the subscription and its reconnect handlers, an event that came may follow
    // one that was missed: an open stream gets nothing live then (the reconnect catches it up from
    // the stream), so it never skips over a gap. A stream catching up keeps what comes in its buffer.
    const whole = pubsub.listening()
    for (const connection of set) if (whole || connection.buffer !== null) deliver(connection, event, bytes)
  })

  // A revoked key ends the streams opened with it, on every instance (the key cache's channel).
  const endKey = (hex: string) => {
    for (const connection of connections.ofKey(hex)) end(connection)
  }
  const revocations = pubsub.listener(keys.channels.keyRevoked, endKey)
  // Revocations published while the subscriber was away were missed: ask about every key again,
  // one at a time (the key cache was just emptied, so each is a query).
  pubsub.onReconnect(() => {
    if (!isKeyLive) return
    void (async () => {
      for (const hex of connections.keyHashes()) {
        try {
          if (!(await isKeyLive(hex))) endKey(hex)
        } catch (error) {
          log.warn('stream key check failed; the remaining keys are checked at the next reconnect', errorFields(error))
          return
        }
      }
    })()
  })

  // Events published while the subscriber was away reached the streams but not this process: once the
  // subscription is back, every open stream is caught up from the stream, as a client's resume would
  // be, and stays open: its client needs no id of its own (one that got nothing yet has none), nor a
  // new stream token. One that fails (Redis gone again) ends: its client resumes from its last id.
  pubsub.onReconnect(() => catchUp.dropped(connections.all(), end))

  const ping = encoder.encode(': ping\n\n')
  const timer = setInterval(() => {
    const heartbeat = redis.pipeline()
    let beats = 0
    const now = Date.now()
    const kept = new Set<string>()
    for (const connection of connections.all()) {
      send(connection, ping)
      if (connection.limitKey && !connection.closed) {
        heartbeat.zadd(connection.limitKey, now, connection.id)
        // The set outlives its open streams by a minute, not by its last opening: expired under
        // them, it would admit as many again (and come back without an expiry at this ZADD).
        if (!kept.has(connection.limitKey)) heartbeat.pexpire(connection.limitKey, openStreamsTtlMs)
        kept.add(connection.limitKey)
        beats++
      }
    }
    if (beats > 0) heartbeat.exec().catch(error => log.warn('stream heartbeat failed', errorFields(error)))
  }, pingEveryMs)
  timer.unref()

  /** Whether the key a stream is opened with is still live (open rather than refuse while Postgres is away). */
  const keyLive = async (keyHash: string) => {
    if (!isKeyLive) return true
    return isKeyLive(keyHash).catch(error => {
      // The stream still ends at the revocation's message.
      log.warn('stream key check failed', errorFields(error))
      return true
    })
  }

  // How many times closeAll ran: a stream whose opening straddles one is ended as it opens.
  let closings = 0

  return {
    get size() {
      return connections.size
    },
    async open({ stream, lastEventId, limit, keyHash = null, replayBudget }) {
      const closedBefore = closings
      if (lastEventId && !isEventId(lastEventId)) throw errors.invalidCursor()
      // Counted only for a resume: an open afresh replays what came during its opening, at most.
      const budget = lastEventId ? replayBudget : undefined
      await budget?.check()
      await events.listen()
      if (keyHash) await revocations.listen()
      const id = randomUUID()
      let limitKey: string | null = null
      if (limit) {
        limitKey = keys.events.openStreams(limit.subject)
        const now = Date.now()
        const admitted = await openStream(redis, [limitKey], [now, now - placeLapseMs, id, limit.max])
        if (admitted !== 1) throw errors.rateLimited(5)
      }
      let connection!: Connection
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          connection = { id, stream, controller, buffer: [], lastId: lastEventId ?? '', limitKey, keyHash, closed: false }
        },
        cancel() {
          end(connection)
        },
      })
      // Listen first, then replay: what arrives meanwhile waits in the buffer and is sent after.
      connections.add(connection)
      // A revocation handled before the stream was added did not end it: ask now that it is.
      if (keyHash && !(await keyLive(keyHash))) {
        end(connection)
        throw errors.invalidToken('The API key this stream was asked for with has been revoked')
      }
      send(connection, encoder.encode('retry: 3000\n\n'))
      let replayed: number
      try {
        // Live or, across a drop of the subscription, caught up from Redis from here on.
        replayed = await catchUp.open(connection, lastEventId)
      } catch (error) {
        end(connection)
        throw error
      }
      // Spent after the fact (its size is known only now), into debt: opens in flight at once
      // overspend by at most a replay each. Not counted if Redis refuses: the stream is sent.
      if (budget && replayed > 0) await budget.spend(replayed).catch(error => log.warn('stream replay not counted', errorFields(error)))
      // A closeAll (shutdown) ran while this stream was being opened, before it was added: it ends
      // too, after its `retry`, so that its client reconnects elsewhere rather than hold the drain.
      if (closings !== closedBefore) end(connection)
      return new Response(body, { headers: streamHeaders })
    },
    closeAll() {
      closings++
      for (const connection of connections.all()) end(connection)
    },
    async close() {
      clearInterval(timer)
      for (const connection of connections.all()) end(connection)
      await events.stop()
      await revocations.stop()
    },
  }
}
