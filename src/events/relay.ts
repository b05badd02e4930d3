/**
 * The outbox relay: moves committed events, oldest first, to the recipients' capped Redis Streams and
 * announces them (and API key revocations, for caches to evict) to every API process, deleting each
 * row once Redis took it (an event whose type has an effect, `RelayEffect`, is sent once it was done)
 * and retrying until it does. Any number of relays may run (one per worker
 * process): a pass holds a transaction-scoped advisory lock, so one relay moves events at a time and
 * none sends an event twice on purpose.
 * A relay that dies between Redis and its commit leaves those rows to be sent again: the copy of an
 * event its stream holds already is dropped (`append`), so each is kept and announced once (as are
 * the rows a database restore brings back, sent before it, while their stream holds them).
 */
import { defineBatchedScript, type Redis } from '../redis.ts'
import type { Sql, TxSql } from '../db.ts'
import type { Keys } from '../keys.ts'
import type { Log } from '../log.ts'
import { errorFields } from '../log.ts'
import { keyRevokedType } from '../auth/store.ts'

/** Kept per stream for replay: the last 1,000 events (and at most 24 h, enforced when replaying). */
export const streamLength = 1000
/**
 * How far back a resume replays; a stream whose newest event is older holds nothing to replay, so it
 * expires then (a user's stream would otherwise keep its last 1,000 events for good, however long
 * ago its user was last told anything).
 */
export const replayWindowMs = 24 * 3_600_000
// Entries read at a time, newest first, looking for a copy of a new event among those kept already.
const recentEntries = 8

/** What every API process hears on the events channel, and what a stream replays. */
export interface Published {
  stream: string
  id: string
  type: string
  data: string
}

// K the stream; A channel, type, JSON, outbox row. Kept and announced in one step, so an event is
// never announced without being kept, nor kept without being announced. An event the stream holds
// already (the same outbox row and payload: row ids can come again after a database restore) is not
// appended again. Its copy is among the newest entries, or behind entries of later rows only: those
// of a pass that died before its commit (the next sends its events again, up to a batch of them), or
// of the passes that ran while an append that timed out (Redis paused) waited to run. So the newest
// entries are looked through a chunk at a time, on while a chunk holds a later row than the event's
// (rows commit out of their order, a few apart), at most as far as the stream keeps (after a
// restore, all its rows may be later than the new events').
const append = defineBatchedScript(
  `
local row, from, looked = tonumber(A[4]), '+', 0
while looked < ${streamLength} do
  local entries = redis.call('XREVRANGE', K[1], from, '-', 'COUNT', ${recentEntries})
  local later = false
  for _, entry in ipairs(entries) do
    if entry[2][6] == A[4] and entry[2][4] == A[3] then return entry[1] end
    local other = tonumber(entry[2][6])
    if other ~= nil and other > row then later = true end
    from = '(' .. entry[1]
  end
  if not later or #entries < ${recentEntries} then break end
  looked = looked + #entries
end
local id = redis.call('XADD', K[1], 'MAXLEN', '~', ${streamLength}, '*', 'type', A[2], 'data', A[3], 'row', A[4])
redis.call('PEXPIRE', K[1], ${replayWindowMs})
redis.call('PUBLISH', A[1], cjson.encode({ stream = K[1], id = id, type = A[2], data = A[3] }))
return id`,
  1,
  4,
)

// Any constant: the same in every process relaying for this database.
const relayLock = 0x616d6f62 // "amob"

/**
 * What delivering events of one type also does, before they are sent (so it is done at least once
 * for every event committed, like the delivery): Redis state the change's own process
 * may not have lived to write. Given the pass's transaction, to read what Postgres holds now.
 */
export type RelayEffect = (tx: TxSql, events: { userId: string | null; data: string }[]) => Promise<void>

export interface RelayDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  log: Log
  /** By event type (src/deps.ts's `relayEffects`). */
  effects?: Record<string, RelayEffect>
}

export interface RelayOptions {
  /** How often an idle relay looks for new events. */
  everyMs?: number
  /** Events moved in one pass. */
  batch?: number
}

export interface Relay {
  /** Moves what is waiting now, pass after pass, until the outbox is empty or another relay holds it; how many were moved. */
  drain(): Promise<number>
  stop(): Promise<void>
}

interface Row {
  id: number
  userId: string | null
  type: string
  data: string
}

/** What one pass did: events sent, and the Redis failure that stopped it early, if one. */
export interface Pass {
  sent: number
  error?: unknown
}

/**
 * One pass: up to `batch` events, in id order, under the lock; null when another relay holds it.
 * What Redis took is deleted in the pass's commit; an event it refused, or whose type's effect
 * failed (and its user's later ones, never sent after it), waits for the next pass.
 */
export async function relayPass(deps: RelayDeps, batch: number): Promise<Pass | null> {
  const { sql, redis, keys } = deps
  return sql.begin(async tx => {
    // The pass reads the oldest events through the key, never by a scan of the table: the plan a
    // connection caches while the outbox is empty (most of the time) is a scan and sort, which a
    // burst then met at every pass until autovacuum had the statement planned again (a price change
    // to 190,000 subscribers: each pass of 500 read all 13,500 pages of the backlog). For the pass's
    // transaction only, set with the lock: no round trip of its own.
    const [lock] = await tx<{ locked: boolean }[]>`
      select pg_try_advisory_xact_lock(${relayLock}) as locked, set_config('enable_seqscan', 'off', true)
    `
    if (!lock!.locked) return null
    const rows = await tx<Row[]>`
      select id, user_id as "userId", type, data from outbox order by id limit ${batch}
    `
    // Each type's effect over the pass's events of that type, begun at once. An event is sent only
    // once its type's effect is done, so an event whose effect failed waits unsent, with its user's
    // later events, as one Redis refused: no copy of it is sent again, and its stream's order holds.
    const effects = new Map<string, Promise<void>>()
    for (const [type, effect] of Object.entries(deps.effects ?? {})) {
      const events = rows.filter(row => row.type === type)
      if (events.length === 0) continue
      const done = effect(tx, events)
      // Its failure is told by its events' sends, and none may be left unhandled (a chain broken before one of them).
      done.catch(() => {})
      effects.set(type, done)
    }
    // One user's events go one after another (users side by side): after one fails, none of that
    // user's later events is sent, so each stream receives them in order.
    const chains = new Map<string | null, Promise<unknown>>()
    const appended = rows.map(row => {
      const effect = effects.get(row.type) ?? Promise.resolve()
      // A revocation is announced to the API processes, on its own: it has no stream and no order.
      if (row.type === keyRevokedType) return effect.then(() => redis.publish(keys.channels.keyRevoked, row.data))
      const stream = row.userId ? keys.events.user(row.userId) : keys.events.chat
      const next = (chains.get(row.userId) ?? Promise.resolve())
        .then(() => effect)
        .then(() => append(redis, [stream], [keys.channels.events, row.type, row.data, row.id]))
      chains.set(row.userId, next)
      return next
    })
    const settled = await Promise.allSettled(appended)
    // Done with the transaction before it commits, even where no event of theirs waited for them.
    await Promise.allSettled(effects.values())
    const sent = rows.filter((_, i) => settled[i]!.status === 'fulfilled').map(row => row.id)
    const failed = settled.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected')
    if (sent.length > 0) await tx`delete from outbox where id in ${tx(sent)}`
    return failed ? { sent: sent.length, error: failed.reason } : { sent: sent.length }
  })
}

/**
 * Starts relaying: a pass every `everyMs` while idle, at once again after a full one, backing off
 * (to 1 s) while Redis or Postgres fails. Failures are logged when they start and when they end.
 *
 * @example
 * const relay = startRelay(deps)
 * await relay.stop()
 */
export function startRelay(deps: RelayDeps, options: RelayOptions = {}): Relay {
  const everyMs = options.everyMs ?? 100
  const batch = options.batch ?? 500
  let stopped = false
  let failingSince = 0
  let wake: (() => void) | undefined
  let timer: ReturnType<typeof setTimeout> | undefined

  const onFailure = (error: unknown) => {
    if (failingSince === 0) {
      failingSince = Date.now()
      deps.log.warn('outbox relay failing; events wait in Postgres', errorFields(error))
    }
  }
  const onSuccess = () => {
    if (failingSince === 0) return
    deps.log.info('outbox relay resumed', { failedForMs: Date.now() - failingSince })
    failingSince = 0
  }

  /** Passes until nothing is left, the lock is another's, or something fails (then thrown). */
  const drain = async (): Promise<number> => {
    let moved = 0
    for (;;) {
      const pass = await relayPass(deps, batch)
      if (!pass) return moved
      moved += pass.sent
      if ('error' in pass) throw pass.error
      if (pass.sent < batch) return moved
    }
  }

  const loop = (async () => {
    let delay = everyMs
    while (!stopped) {
      try {
        await drain()
        onSuccess()
        delay = everyMs
      } catch (error) {
        onFailure(error)
        delay = Math.min(delay * 2, 1000)
      }
      if (stopped) break
      await new Promise<void>(resolve => {
        wake = resolve
        timer = setTimeout(resolve, delay)
      })
    }
  })()

  return {
    drain,
    async stop() {
      stopped = true
      clearTimeout(timer)
      wake?.()
      await loop
    },
  }
}
