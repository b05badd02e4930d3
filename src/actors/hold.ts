/**
 * Holding actors: a lease in Redis with a fencing token drawn in the same step, renewed while held,
 * let go together with the acknowledgement of the mail it finished. Postgres checks the token in
 * every transaction that applies commands (turn.ts), so a holder that lost its lease cannot commit.
 */
import { defineBatchedScript, defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'

const group = 'actor'
// One consumer name for every holder: the next holder reads what the last one left unacknowledged.
const consumer = 'holder'

// K lease, fence, mailbox; A holder, ms, mail. Takes the lease and draws a token; when held elsewhere,
// the milliseconds that lease has left. `mail` 0 holds without reading; n reads up to n entries, first
// what a previous holder read and never acknowledged (the third element then 1). A mailbox appended
// to without a group (new, or deleted once empty) gets one from its first entry.
const take = defineBatchedScript(
  `
if not redis.call('SET', K[1], A[1], 'NX', 'PX', A[2]) then return redis.call('PTTL', K[1]) end
local drawn, token = pcall(redis.call, 'INCR', K[2])
local function give_up(err)
  redis.call('DEL', K[1])
  error(err)
end
if not drawn then give_up(token) end
local count = tonumber(A[3])
if count == 0 then return {token, {}, 0} end
local function read(from)
  local found = redis.pcall('XREADGROUP', 'GROUP', '${group}', '${consumer}', 'COUNT', count, 'STREAMS', K[3], from)
  if type(found) == 'table' and found.err and string.find(found.err, 'NOGROUP', 1, true) then
    redis.pcall('XGROUP', 'CREATE', K[3], '${group}', '0', 'MKSTREAM')
    found = redis.pcall('XREADGROUP', 'GROUP', '${group}', '${consumer}', 'COUNT', count, 'STREAMS', K[3], from)
  end
  if type(found) == 'table' and found.err then give_up(found.err) end
  if found then return found[1][2] end
  return {}
end
local mail = read('0')
if #mail > 0 then return {token, mail, 1} end
return {token, read('>'), 0}`,
  3,
  3,
)
// K lease; A holder, ms.
const renew = defineBatchedScript(
  `
if redis.call('GET', K[1]) == A[1] then return redis.call('PEXPIRE', K[1], A[2]) end
return 0`,
  1,
  2,
)
// K mailbox, lease; A holder, finished entry ids (space-separated). Acknowledges and deletes them,
// lets go of the lease and says how much mail is left; an empty mailbox goes (its group with it,
// made again by the next read), so an actor keeps nothing in Redis between commands.
const release = defineBatchedScript(
  `
local ids = {}
for id in string.gmatch(A[2], '%S+') do ids[#ids + 1] = id end
if #ids > 0 then
  redis.call('XACK', K[1], '${group}', unpack(ids))
  redis.call('XDEL', K[1], unpack(ids))
end
if redis.call('GET', K[2]) == A[1] then redis.call('DEL', K[2]) end
local left = redis.call('XLEN', K[1])
if left == 0 then redis.call('DEL', K[1]) end
return left`,
  2,
  2,
)
// KEYS fence; ARGV at least. After Redis lost the fence counter, lifts it past what Postgres has seen.
const raise = defineScript(`
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1`)

export interface MailEntry {
  entryId: string
  /** Null for an entry deleted while pending: it was finished already. */
  list: string[] | null
  fields: Record<string, string>
}

export interface Hold {
  actor: string
  /** The actor's kind: what comes before the first colon. */
  kind: string
  token: number
  mail: MailEntry[]
  /** The mail was read before by a holder that never acknowledged it: it may have been applied. */
  redelivered: boolean
  /** Found lost by a renewal (or let go): whatever it would still write in Redis is stale. */
  lost: boolean
}

/**
 * Not taken: held elsewhere, by a lease that runs out in `leftMs` unless its holder renews it (-1: no
 * expiry known).
 */
export interface Busy {
  busy: true
  leftMs: number
}

/** What taking an actor came to: held; not taken (held elsewhere); or failed (the lease may have been taken: release it). */
export type Taken = Hold | Busy | Error

/** Whether the actor was taken. */
export function isHold(taken: Taken): taken is Hold {
  return !(taken instanceof Error) && !('busy' in taken)
}

/** An actor to take, and how much of its mail to read (0: none). */
export interface TakeRequest {
  actor: string
  mail: number
}

export interface Holder {
  readonly id: string
  /** Takes each actor; one call for them all. */
  take(requests: TakeRequest[]): Promise<Taken[]>
  /** Renews the holds every third of the lease until the function returned is called. */
  keep(holds: Hold[]): () => void
  /** Acknowledges the finished entries, lets go, and says how much mail is left. */
  release(actor: string, finished: string[]): Promise<number>
  /** Lifts the actor's fencing counter past a token Postgres has seen. */
  raiseFence(actor: string, atLeast: number): Promise<void>
  /** Stops every renewal, like a killed process (for tests): the leases run out. */
  abandon(): void
}

export function createHolder(redis: Redis, keys: Keys, id: string, leaseMs: number): Holder {
  const renewals = new Set<ReturnType<typeof setInterval>>()
  return {
    id,
    async take(requests) {
      const calls = requests.map(({ actor, mail }) => {
        const k = keys.actor(actor)
        return take(redis, [k.lease, k.fence, k.mailbox], [id, leaseMs, mail]).then(
          found => toHold(actor, found as [number, [string, string[] | null][], number] | number),
          (error: Error) => error,
        )
      })
      return Promise.all(calls)
    },
    keep(holds) {
      const timer = setInterval(() => {
        for (const hold of holds) {
          if (hold.lost) continue
          renew(redis, [keys.actor(hold.actor).lease], [id, leaseMs]).then(
            kept => void (kept === 1 || (hold.lost = true)),
            // Redis away: the next renewal tries again; the lease runs out only if it stays away.
            () => {},
          )
        }
      }, leaseMs / 3)
      renewals.add(timer)
      return () => {
        clearInterval(timer)
        renewals.delete(timer)
      }
    },
    abandon() {
      for (const timer of renewals) clearInterval(timer)
    },
    async release(actor, finished) {
      const k = keys.actor(actor)
      return Number(await release(redis, [k.mailbox, k.lease], [id, finished.join(' ')]))
    },
    async raiseFence(actor, atLeast) {
      await raise(redis, [keys.actor(actor).fence], [atLeast])
    },
  }
}

function toHold(actor: string, found: [number, [string, string[] | null][], number] | number): Taken {
  if (typeof found === 'number') return { busy: true, leftMs: found }
  const mail = found[1].map(([entryId, list]) => ({ entryId, list, fields: list ? toRecord(list) : {} }))
  return { actor, kind: actor.slice(0, actor.indexOf(':')), token: Number(found[0]), mail, redelivered: found[2] === 1, lost: false }
}

function toRecord(list: string[]): Record<string, string> {
  const out: Record<string, string> = {}
  for (let i = 0; i + 1 < list.length; i += 2) out[list[i]!] = list[i + 1]!
  return out
}
