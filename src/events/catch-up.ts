/**
 * Where each open stream stands in its Redis stream, and bringing it there. Events go to a stream in
 * order and once (by id): live, or, while it catches up from Redis (a resume from Last-Event-ID, its
 * opening, the subscription back after a drop), into its buffer, sent after what the read returned.
 * A resume from an event the stream no longer holds, from within its replay window (Redis lost it,
 * or more than the stream keeps came since), is told so first: `events.missed`, never a silent gap.
 */
import type { Redis } from '../redis.ts'
import { replayWindowMs, streamLength, type Published } from './relay.ts'
import type { Connection } from './connections.ts'

const encoder = new TextEncoder()

/** An event with its frame, encoded once however many streams it goes to. */
interface Framed {
  event: Published
  bytes: Uint8Array
}

/** What a stream holds after a place: its events, and whether some after that place are gone. */
interface Read {
  framed: Framed[]
  missed: boolean
}

/**
 * The type of the notice a resume gets when events after its place are gone. Its `id:` is that place
 * (every event carries one, CONTRACT.md §8), so a resume after it asks from the same place.
 */
export const missedType = 'events.missed'

export type CatchUp = ReturnType<typeof createCatchUp>

export function createCatchUp(redis: Redis, send: (connection: Connection, bytes: Uint8Array) => void) {
  // How many times the subscription came back after a drop: a catch-up that saw one more while it
  // read may have missed what was published meanwhile, so it reads again before it goes live.
  let drops = 0
  // Streams at the same place share one read (the world chat's listeners, most of the time), one
  // begun since the last drop only: an older one may have run before what the drop missed was written.
  // And one sent after the stream listened only (its opening counted before the read began): an event
  // that came live before it listened, but after the read ran, is in neither its buffer nor the read.
  let opened = 0
  const openedAs = new WeakMap<Connection, number>()
  const reads = new Map<string, { read: Promise<Read>; opened: number }>()
  const readShared = (connection: Connection) => {
    const { stream, lastId: from } = connection
    const at = `${drops} ${stream} ${from}`
    let shared = reads.get(at)
    if (!shared || shared.opened < (openedAs.get(connection) ?? 0)) {
      const read = readAfter(redis, stream, from).then(({ events, missed }) => ({
        framed: events.map(event => ({ event, bytes: frame(event) })),
        missed,
      }))
      const entry = { read, opened }
      reads.set(at, entry)
      void read.finally(() => reads.get(at) === entry && reads.delete(at)).catch(() => {})
      shared = entry
    }
    return shared.read
  }

  /** Sends the event unless the stream has it already, or keeps it while the stream catches up. */
  const deliver = (connection: Connection, event: Published, bytes?: Uint8Array) => {
    if (connection.buffer) return void connection.buffer.push(event)
    if (connection.lastId && !isAfter(event.id, connection.lastId)) return
    connection.lastId = event.id
    send(connection, bytes ?? frame(event))
  }

  /**
   * Sends a stream what Redis holds after the last event it sent, again while the subscription
   * dropped meanwhile, then what came live during the read (its buffer), and goes live. `covered`:
   * the drops it needs no read for (a stream opened afresh, after the newest event at its opening).
   * `resumed`: a client's resume, told first when events after its place are gone. How many events
   * the reads sent.
   */
  const catchUp = async (connection: Connection, covered = -1, resumed = false) => {
    connection.buffer ??= []
    let sent = 0
    while (covered !== drops && !connection.closed) {
      covered = drops
      const { framed, missed } = await readShared(connection)
      if (resumed && missed) send(connection, missedFrame(connection.lastId))
      resumed = false
      for (const { event, bytes } of framed) {
        if (!isAfter(event.id, connection.lastId)) continue
        connection.lastId = event.id
        send(connection, bytes)
        sent++
      }
    }
    const buffered = connection.buffer
    connection.buffer = null
    for (const event of buffered) deliver(connection, event)
    return sent
  }

  return {
    deliver,
    /**
     * Brings a stream being opened (buffering what comes live) to its place: after the client's last
     * id, or after the stream's newest event (what came before it is not its own). A stream opened
     * afresh is told that place as an id without an event (a browser's EventSource takes it as its
     * last event id): its client, reconnecting before any event came, resumes from there and misses
     * none sent in between. How many events were replayed from Redis.
     */
    async open(connection: Connection, lastEventId: string | null | undefined): Promise<number> {
      // Listening already (added to the streams): a read sent from now on may serve it.
      openedAs.set(connection, ++opened)
      if (lastEventId) return catchUp(connection, -1, true)
      const covered = drops
      connection.lastId = await newestId(redis, connection.stream)
      const sent = await catchUp(connection, covered)
      send(connection, encoder.encode(`id: ${connection.lastId}\n\n`))
      return sent
    },
    /**
     * The subscription is back after a drop: every stream is caught up, as a client's resume would
     * be (one catching up already reads again); `failed` is told of one whose catch-up failed.
     */
    dropped(connections: Iterable<Connection>, failed: (connection: Connection) => void) {
      drops++
      for (const connection of connections) if (connection.buffer === null) void catchUp(connection).catch(() => failed(connection))
    },
  }
}

/** Stream ids are `<ms>-<seq>`: compared as numbers, never as strings. */
export function isAfter(a: string, b: string): boolean {
  const [am, as] = a.split('-').map(Number) as [number, number]
  const [bm, bs] = b.split('-').map(Number) as [number, number]
  return am > bm || (am === bm && as > bs)
}

export function frame(event: Published) {
  return encoder.encode(`id: ${event.id}\nevent: ${event.type}\ndata: ${event.data}\n\n`)
}

/** Tells a resumed stream that events after `after` are gone from Redis: the client re-reads what it keeps of them. */
function missedFrame(after: string) {
  const data = JSON.stringify({ type: missedType, createdAt: new Date().toISOString(), after })
  return encoder.encode(`id: ${after}\nevent: ${missedType}\ndata: ${data}\n\n`)
}

/** The id of the stream's newest event; `0-0` for a stream with none, so that its first is after it. */
async function newestId(redis: Redis, stream: string): Promise<string> {
  const [newest] = (await redis.xrevrange(stream, '+', '-', 'COUNT', 1)) as [string, string[]][]
  return newest?.[0] ?? '0-0'
}

/**
 * The stream's events after `from`, within the replay window: the newest `streamLength` of them, what
 * the stream promises to keep (trimmed a node at a time, it may hold more). `missed`: the read does
 * not reach back to `from` itself, an event from within the window (a minute's margin for clocks):
 * Redis lost it (a restart without its data, a failover to a replica that lagged) and perhaps what
 * followed it, or more events than the stream keeps came after it. `0-0`, the place of a stream
 * opened when it was empty, is no event to reach: from there, some are missed when the stream holds
 * more than the read sends, or has dropped one from within the window (`droppedWithin`). An older
 * place's events were beyond the window anyway.
 */
async function readAfter(redis: Redis, stream: string, from: string): Promise<{ events: Published[]; missed: boolean }> {
  const oldest = Date.now() - replayWindowMs
  const entries = (await redis.xrevrange(stream, '+', from, 'COUNT', streamLength + 1)) as [string, string[]][]
  // The read holds nothing before `from`: an entry not after it is `from` itself (compared as
  // numbers: a client may send the id with leading zeros).
  const isFrom = (id: string) => !isAfter(id, from)
  const reached = entries.length > 0 && isFrom(entries.at(-1)![0])
  const after = entries.filter(([id]) => !isFrom(id) && Number(id.split('-')[0]) >= oldest)
  const missed = isAfter(from, '0-0')
    ? !reached && Number(from.split('-')[0]) >= oldest + 60_000
    : after.length > streamLength || (after.length > 0 && (await droppedWithin(redis, stream, oldest + 60_000)))
  const events = after
    .slice(0, streamLength)
    .reverse()
    .map(([id, fields]) => ({ stream, id, type: fields[fields.indexOf('type') + 1]!, data: fields[fields.indexOf('data') + 1]! }))
  return { events, missed }
}

/**
 * Whether the stream may have dropped an event from `since` on: it has been trimmed (Redis 7 counts
 * the entries ever added to it) and its oldest entry left is from then on, so what was trimmed before
 * it may be too. A stream gone meanwhile (expired) has dropped nothing it still has to tell of.
 */
async function droppedWithin(redis: Redis, stream: string, since: number): Promise<boolean> {
  const info = (await redis.xinfo('STREAM', stream).catch((error: unknown) => {
    if (/no such key/i.test((error as Error | null)?.message ?? '')) return []
    throw error
  })) as unknown[]
  const field = (name: string) => (info.includes(name) ? info[info.indexOf(name) + 1] : undefined)
  const first = String(field('recorded-first-entry-id') ?? '0-0')
  return Number(field('entries-added')) > Number(field('length')) && Number(first.split('-')[0]) >= since
}
