/**
 * What an address may make the service spend on API keys that were never issued. A well-formed key
 * (its checksum is public) that no process has seen costs a Postgres lookup, and the answer takes a
 * place in the key cache; forged keys sent by the thousand would cost as many queries and push live
 * keys out. So each made-up key an address sends is counted in the `apiKeyMisses` bucket (Redis,
 * shared by every process); once a process finds it empty, it answers that address 429 for any key
 * it has not cached, with no query, for the rule's window. Keys it has cached, and other credentials,
 * still pass. Keys once issued (revoked, rotated out) are not counted: agents behind one address that
 * poll on with them are not mistaken for a flood.
 */
import type { Clock } from '../clock.ts'
import type { RateRule } from '../config.ts'
import { AppError, errors } from '../errors.ts'
import { throttled, type Log } from '../log.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'

export interface UnknownKeyLimit {
  /** Throws 429 while this process refuses the address unknown keys. */
  admit(subject: string): void
  /** Counts an unknown key; once the bucket is empty, refuses the address here for the rule's window. */
  missed(subject: string): void
}

/** Addresses refused at once, past which the oldest is let go: a bound on memory, not a limit of its own. */
const maxRefused = 100_000

export function createUnknownKeyLimit(rateLimiter: RateLimiter, rule: RateRule, clock: Clock, log: Log): UnknownKeyLimit {
  const windowMs = rule.perSeconds * 1000
  // A refusal is told, the first of them and then once a minute with how many more there were: a
  // flood from many addresses writes a line a minute, not one an address.
  const said = throttled(log, 60_000)
  // Address -> when its refusal began, by `clock` (which tests move on) and by the monotonic clock; it
  // ends when either has gone the window: a wall clock stepped back (NTP, a VM resumed) would hold it longer.
  const refused = new Map<string, { at: number; monotonicAt: number }>()
  return {
    admit(subject) {
      const since = refused.get(subject)
      if (since === undefined) return
      const left = windowMs - Math.max(clock.now().getTime() - since.at, performance.now() - since.monotonicAt)
      if (left > 0) throw errors.rateLimited(Math.ceil(left / 1000))
      refused.delete(subject)
    },
    missed(subject) {
      // Not awaited: the request is answered 401 either way, and a Redis that cannot count (down,
      // paused) leaves the address unrefused rather than delay the answer.
      rateLimiter.take('apiKeyMisses', subject).catch((error: unknown) => {
        if (!(error instanceof AppError && error.status === 429)) return
        if (refused.size >= maxRefused) refused.delete(refused.keys().next().value!)
        refused.set(subject, { at: clock.now().getTime(), monotonicAt: performance.now() })
        said('warn', 'refused', 'an address sent too many made-up API keys: keys not cached are refused to it', {
          address: subject.replace(/^ip:/, ''),
          seconds: rule.perSeconds,
        })
      })
    },
  }
}
