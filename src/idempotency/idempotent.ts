/** Idempotency-Key: the first response is stored with the effect, in one transaction, and replayed. */
import { createHash } from 'node:crypto'
import { t } from 'elysia'
import { deleteOlderThan, type Sql, type TxSql } from '../db.ts'
import type { Clock } from '../clock.ts'
import { AppError, errors } from '../errors.ts'
import { errorFields, type Log } from '../log.ts'

export const idempotencyWindowMs = 24 * 3_600_000

export interface Outcome {
  status: number
  body: unknown
}

export interface IdempotentRequest {
  /** Whose key it is: keys of different callers never collide. */
  subject: string
  key: string | undefined | null
  method: string
  path: string
  body: unknown
}

/**
 * Runs `effect` in a transaction. With an Idempotency-Key, a repeat of the same request within 24 h
 * returns the stored outcome without running anything; the same key with another request is 409
 * `idempotency_key_reused`. A repeat while the first's transaction is open is 409
 * `idempotency_key_in_progress` with a Retry-After of a second (CONTRACT.md §9): it holds no
 * connection waiting for the first. A failed effect stores nothing, so it may be retried.
 *
 * @example
 * const outcome = await idempotent({ sql, clock }, request, tx => subscribe(tx, ...))
 */
export async function idempotent(
  { sql, clock }: { sql: Sql; clock: Clock },
  request: IdempotentRequest,
  effect: (tx: TxSql) => Promise<Outcome>,
): Promise<Outcome & { replayed: boolean }> {
  const key = request.key
  if (key === undefined || key === null) return { ...(await sql.begin(effect)), replayed: false }
  checkKey(key)
  const hash = requestHash(request)
  return sql.begin(async tx => {
    // Held by the first until its transaction ends: once it committed, its outcome is there to replay.
    const [{ locked }] = await tx<[{ locked: boolean }]>`
      select pg_try_advisory_xact_lock(hashtext(${request.subject}), hashtext(${key})) as locked
    `
    if (!locked) throw errors.idempotencyInProgress(1)
    const now = clock.now()
    const [stored] = await tx<{ requestHash: Buffer; status: number; body: string; createdAt: Date }[]>`
      select request_hash as "requestHash", response_status as status, response_body as body, created_at as "createdAt"
      from idempotency_keys
      where subject = ${request.subject} and key = ${key}
    `
    if (stored && now.getTime() - stored.createdAt.getTime() < idempotencyWindowMs) {
      if (!stored.requestHash.equals(hash)) throw errors.idempotencyKeyReused()
      return { status: stored.status, body: JSON.parse(stored.body), replayed: true }
    }
    const outcome = await effect(tx)
    await tx`
      insert into idempotency_keys (subject, key, request_hash, response_status, response_body, created_at)
      values (${request.subject}, ${key}, ${hash}, ${outcome.status}, ${JSON.stringify(outcome.body)}, ${now})
      on conflict (subject, key) do update
        set request_hash = excluded.request_hash, response_status = excluded.response_status,
            response_body = excluded.response_body, created_at = excluded.created_at
    `
    return { ...outcome, replayed: false }
  })
}

/** Forgets keys older than the replay window, in batches. */
export function purgeIdempotencyKeys(sql: Sql, now: Date): Promise<number> {
  return deleteOlderThan(sql, 'idempotency_keys', 'created_at', new Date(now.getTime() - idempotencyWindowMs))
}

/**
 * How long a command's reservation lasts unless renewed (every third of it while `send` runs): an
 * actor's answer is waited for as long (the dispatcher's ask, 10 s), so a repeat told to come back
 * after the lease finds the first answered, or failed with its lease let go.
 */
export const commandLeaseMs = 10_000

/**
 * For commands applied by actors, and upstream calls. The key is reserved with the request's
 * fingerprint before anything is sent, so a key reused with another request is refused whichever
 * actor it would reach; a repeat gets the stored response without running `send` (so no check can
 * refuse a replay). The reservation is a lease, renewed while `send` runs: a repeat meanwhile is 409
 * `idempotency_key_in_progress` with a Retry-After of the lease's remaining seconds (CONTRACT.md §9).
 * One not renewed for a whole lease belongs to a process that died (or stalled): a repeat takes it
 * over with the same command id, which an actor applies once. A 5xx (it may have been applied) keeps
 * the reservation with its lease let go, so the retry takes it over at once; a 4xx of the request
 * that made it frees the key.
 */
export interface CommandOptions {
  /** Failures to keep as the outcome (the effect happened, e.g. the upstream was reached); others free the key or let the lease go. */
  keepFailure?: (error: AppError) => boolean
  /** The lease's length: `commandLeaseMs` unless said. */
  leaseMs?: number
}

/** What a command sent under a reservation is known by; every repeat of the request gets the same. */
export interface CommandIdentity {
  commandId?: string
  requestHash?: Buffer
  /** When the reservation was made (not when it was last renewed or taken over). */
  reservedAt?: Date
}

export async function idempotentCommand(
  { sql, clock, log }: { sql: Sql; clock: Clock; log?: Log },
  request: IdempotentRequest,
  send: (identity: CommandIdentity) => Promise<Outcome>,
  options: CommandOptions = {},
): Promise<Outcome & { replayed: boolean }> {
  const key = request.key
  if (key === undefined || key === null) return { ...(await send({})), replayed: false }
  checkKey(key)
  const leaseMs = options.leaseMs ?? commandLeaseMs
  const hash = requestHash(request)
  const taken = await reserve(sql, request.subject, key, hash, clock.now(), leaseMs)
  if ('replay' in taken) return { ...taken.replay, replayed: true }
  const { reservation, at, own } = taken
  const made = reservedAt(reservation, taken.found)
  // What marks the reservation as this caller's; the lease's renewals move `at` on.
  const mine: Holding = { reservation, at, unsure: [] }
  // One command id per reservation: a repeat that takes it over sends the same (applied once), a
  // key used again after its window or after a refusal is a new command.
  const commandId = createHash('sha256')
    .update(JSON.stringify([request.subject, key, reservation]))
    .digest('hex')
  const settle = (write: () => Promise<unknown>) => settleReservation(write, leaseMs, log, { subject: request.subject, key })
  const lease = keepLease({ sql, clock }, request.subject, key, mine, leaseMs)
  let outcome: Outcome
  try {
    outcome = await send({ commandId, requestHash: hash, reservedAt: made })
  } catch (error) {
    await lease.stop()
    if (error instanceof AppError && options.keepFailure?.(error)) {
      await settle(() => complete(sql, request.subject, key, mine, { status: error.status, body: errorBody(error) }))
    } else if (!own || !(error instanceof AppError && error.status < 500)) {
      // Failed after it may have done something (an actor that did not answer in time, a proxy call
      // that reached its upstream and could not be metered): the reservation stays, its lease let go
      // at once, so the retry takes it over with the same command id, applied once, and what derives
      // from it (the usage event) is the same again. A take-over refused before it sent anything (its
      // checks failed) leaves it so too: an earlier attempt may have sent the command under it. One
      // the previous release made goes back to the time it bore (lapsed: it was taken over a lease
      // after it), which is its reply's time (`reservedAt`).
      const lapsed = timeOrdered(reservation) ? new Date(mine.at.getTime() - leaseMs) : made
      await settle(
        () => sql`
          update idempotency_keys set created_at = ${lapsed}
          where subject = ${request.subject} and key = ${key} and response_status is null
            and created_at = any(${heldAt(mine)}::timestamptz[]) and reservation = ${reservation}
        `,
      ).catch(() => {})
    } else {
      // Refused, so nothing happened: the key is free again, also for a corrected request. Only
      // this reservation's, and never one taken over (`joined`, as the previous release marked its
      // repeats), whose taker may have sent the command under it, even should its time be back at
      // one this caller held.
      await settle(
        () => sql`
          delete from idempotency_keys
          where subject = ${request.subject} and key = ${key} and response_status is null
            and created_at = any(${heldAt(mine)}::timestamptz[]) and reservation = ${reservation} and not joined
        `,
      ).catch(() => {})
    }
    throw error
  }
  await lease.stop()
  await settle(() => complete(sql, request.subject, key, mine, outcome))
  return { ...outcome, replayed: false }
}

/**
 * A reservation to run under (its id, the time that marks it as this caller's, the time it bore when
 * found, and whether this caller made it rather than taking it over), or the outcome to replay.
 */
type Taken = { reservation: string; at: Date; found: Date; own: boolean } | { replay: Outcome }

/**
 * Reserves the key for this request, or finds what holds it: a stored outcome to replay, a request in
 * flight to refuse (409 in progress), or a reservation whose lease lapsed to take over.
 */
async function reserve(sql: Sql, subject: string, key: string, hash: Buffer, now: Date, leaseMs: number): Promise<Taken> {
  for (let attempt = 1; ; attempt++) {
    const [reserved] = await sql<{ reservation: string }[]>`
      insert into idempotency_keys (subject, key, request_hash, created_at, reservation)
      values (${subject}, ${key}, ${hash}, ${now}, ${Bun.randomUUIDv7('hex', now)})
      on conflict (subject, key) do update
        set request_hash = excluded.request_hash, created_at = excluded.created_at,
            response_status = null, response_body = null, reservation = excluded.reservation, joined = false
        where idempotency_keys.created_at < ${new Date(now.getTime() - idempotencyWindowMs)}
      returning reservation
    `
    if (reserved) return { reservation: reserved.reservation, at: now, found: now, own: true }
    const [stored] = await sql<{ requestHash: Buffer; status: number | null; body: string | null; createdAt: Date; reservation: string }[]>`
      select request_hash as "requestHash", response_status as status, response_body as body,
        created_at as "createdAt", reservation
      from idempotency_keys where subject = ${subject} and key = ${key}
    `
    if (!stored) {
      // Freed between the two statements (its request was refused): reserve it afresh.
      if (attempt < 3) continue
      throw errors.unavailable('The Idempotency-Key is changing hands; try again')
    }
    if (!stored.requestHash.equals(hash)) throw errors.idempotencyKeyReused()
    // Past this point the key is in progress, so it has a reservation (sql/00015).
    if (stored.status != null) return { replay: { status: stored.status, body: JSON.parse(stored.body!) } }
    // A reservation's time is its lease's last renewal.
    const held = now.getTime() - stored.createdAt.getTime()
    // One repeat takes an abandoned reservation over (the others still see it in progress); the
    // reservation id stays, so the command id and what is derived from it (a usage event's id) stay too.
    const [takenOver] =
      held >= leaseMs
        ? await sql`
            update idempotency_keys set created_at = ${now}, joined = true
            where subject = ${subject} and key = ${key} and response_status is null and created_at = ${stored.createdAt}
            returning 1
          `
        : []
    // Try again when the lease would lapse: by then the request has finished, or its holder is gone
    // (at most a lease away, should the holder's clock run ahead of this one).
    if (!takenOver) throw errors.idempotencyInProgress(Math.ceil(Math.min(leaseMs, Math.max(1000, leaseMs - held)) / 1000))
    return { reservation: stored.reservation, at: now, found: stored.createdAt, own: false }
  }
}

/**
 * When a reservation was made: the time of its id (a UUIDv7), which renewals and take-overs leave
 * alone, so that a row id derived from it (a reply's message id) is the same on every attempt. One
 * the previous release made (a UUIDv4) has it in the time it bore when found: that release renewed
 * no reservation of an actor command, and took its reply's time from there. A take-over that fails
 * puts that time back (`lapsed`) for the next; one whose process dies leaves its last renewal there.
 */
function reservedAt(reservation: string, found: Date): Date {
  return timeOrdered(reservation) ? new Date(parseInt(reservation.replaceAll('-', '').slice(0, 12), 16)) : found
}

/** Whether a reservation id is a UUIDv7, as this release makes them (the previous one's were UUIDv4). */
function timeOrdered(reservation: string): boolean {
  return reservation[14] === '7'
}

/**
 * Renews a reservation's lease (its `created_at`) every third of `leaseMs` until stopped, so that
 * repeats see it in progress while this process works and may take it over soon after it dies. A
 * renewal that finds the reservation taken over stops renewing; one that fails (Postgres away) is
 * tried again at the next tick: the lease lapses only if none lands for a whole `leaseMs`. One that
 * failed may have landed (its answer lost): its time marks the reservation as this caller's too.
 */
function keepLease({ sql, clock }: { sql: Sql; clock: Clock }, subject: string, key: string, mine: Holding, leaseMs: number) {
  let renewing: Promise<void> | undefined
  const renew = async () => {
    const now = clock.now()
    const [renewed] = await sql`
      update idempotency_keys set created_at = ${now}
      where subject = ${subject} and key = ${key} and response_status is null
        and created_at = any(${heldAt(mine)}::timestamptz[]) and reservation = ${mine.reservation}
      returning 1
    `.catch((error: unknown) => {
      // Its answer lost (the connection dropped), it may have landed all the same: the reservation
      // may bear this time now.
      mine.unsure.push(now)
      throw error
    })
    if (!renewed) return clearInterval(timer)
    mine.at = now
    mine.unsure = []
  }
  const timer = setInterval(() => {
    renewing ??= renew()
      .catch(() => {})
      .finally(() => (renewing = undefined))
  }, leaseMs / 3)
  return {
    /** Stops renewing, once a renewal under way has landed or failed, so that `mine` is final. */
    async stop() {
      clearInterval(timer)
      await renewing
    },
  }
}

/**
 * Writes what became of a reservation (its outcome, or the key let go). If that fails (Postgres
 * away), the failure is thrown, and the write is tried again in the background every
 * twentieth of it until it lands or the lease has lapsed anyway: repeats meanwhile are refused as in
 * progress, and then replay the stored outcome (the upstream is not called twice) or take the key
 * over at once, rather than waiting out the lease. Each write touches only this caller's reservation,
 * so a late one changes nothing once the key was taken over. Given up, it is logged: a repeat now
 * takes the key over and may do the work (call the upstream) a second time.
 */
async function settleReservation(
  write: () => Promise<unknown>,
  leaseMs: number,
  log: Log | undefined,
  fields: { subject: string; key: string },
): Promise<void> {
  try {
    await write()
  } catch (error) {
    void retryUntilLanded(write, leaseMs / 20, performance.now() + leaseMs).then(last => {
      if (last === undefined) return
      log?.warn('an Idempotency-Key’s outcome could not be stored within its lease; a repeat may run the call again', {
        ...fields,
        ...errorFields(last),
      })
    })
    throw error
  }
}

/** Undefined once the write landed; else the last failure, once `untilMs` has passed. */
async function retryUntilLanded(write: () => Promise<unknown>, everyMs: number, untilMs: number): Promise<unknown> {
  let last: unknown = new Error('not tried')
  while (performance.now() < untilMs) {
    await new Promise(resolve => setTimeout(resolve, everyMs).unref())
    try {
      await write()
      return undefined
    } catch (error) {
      // Still away: again at the next tick.
      last = error
    }
  }
  return last
}

/** Stores the outcome of the reservation this caller holds (made, taken over or last renewed at `at`); one taken over or made anew since is left alone. */
async function complete(sql: Sql, subject: string, key: string, mine: Holding, outcome: Outcome) {
  await sql`
    update idempotency_keys set response_status = ${outcome.status}, response_body = ${JSON.stringify(outcome.body)}
    where subject = ${subject} and key = ${key} and created_at = any(${heldAt(mine)}::timestamptz[]) and reservation = ${mine.reservation}
  `
}

/**
 * A reservation as this caller holds it: its id, and the time that marks it as this caller's (when it
 * was made, taken over or last renewed), or one of the renewals since whose answer was lost.
 */
interface Holding {
  reservation: string
  at: Date
  unsure: Date[]
}

/** The times a reservation of this caller's may bear. */
function heldAt(mine: Holding): string[] {
  return [mine.at, ...mine.unsure].map(time => time.toISOString())
}

function errorBody(error: AppError) {
  return { success: false, statusCode: error.status, error: error.code, message: error.message }
}

/** The contract's rule for a key, in the words of every refusal of one, the header schema's too. */
const keyRule = 'must be 1 to 255 characters'

/** Routes check the header first (IdempotencyHeaders); this refuses a key that skipped it alike. */
function checkKey(key: string) {
  if (key.length < 1 || key.length > 255) {
    throw errors.validation('The headers are not valid', [{ path: '/idempotency-key', message: keyRule }])
  }
}

function requestHash({ method, path, body }: IdempotentRequest): Buffer {
  return createHash('sha256')
    .update(JSON.stringify([method, path, canonical(body)]))
    .digest()
}

function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical)
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.keys(value)
        .sort()
        .map(key => [key, canonical((value as Record<string, unknown>)[key])]),
    )
  }
  return value ?? null
}

/** The optional header, documented on every route that honours it. */
export const IdempotencyHeaders = t.Object({
  'idempotency-key': t.Optional(
    t.String({
      minLength: 1,
      maxLength: 255,
      // What a client is told when a key fails (error-handler.ts), rather than TypeBox's wording.
      error: keyRule,
      description:
        'Repeats with the same key and body within 24 h replay the first response; one sent while the first still runs is ' +
        '409 idempotency_key_in_progress with Retry-After',
    }),
  ),
})
