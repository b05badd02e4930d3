/** Publishing events: appended to the recipient's capped Redis Stream and announced to every API process. */
import { defineBatchedScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import { errorFields } from '../log.ts'

export type EventType =
  | 'subscription.created'
  | 'subscription.cancelled'
  | 'review.created'
  | 'review.updated'
  | 'config.purchased'
  | 'conversation.message'
  | 'conversation.reply'
  | 'service.requested'
  | 'service.completed'
  | 'service.failed'
  | 'invoice.issued'
  | 'usage.threshold'
  | 'blog.published'
  | 'context.updated'
  | 'chat.message'

/** Kept per stream for replay: the last 1,000 events (and at most 24 h, enforced when replaying). */
export const streamLength = 1000

// K the stream; A channel, type, JSON (of each event: the events of a tick leave together). Append and
// announce in one step, so an event is never announced without being kept, nor kept without being
// announced.
const append = defineBatchedScript(
  `
local id = redis.call('XADD', K[1], 'MAXLEN', '~', ${streamLength}, '*', 'type', A[2], 'data', A[3])
redis.call('PUBLISH', A[1], cjson.encode({ stream = K[1], id = id, type = A[2], data = A[3] }))
return id`,
  1,
  3,
)

export interface NotifyDeps {
  redis: Redis
  keys: Keys
  clock: Clock
  log: Log
}

export interface Published {
  stream: string
  id: string
  type: string
  data: string
}

/** Appends an event to a stream; returns its id. */
export async function publish(deps: NotifyDeps, stream: string, type: EventType, payload: Record<string, unknown>): Promise<string> {
  const data = JSON.stringify({ type, createdAt: deps.clock.now().toISOString(), ...payload })
  return (await append(deps.redis, [stream], [deps.keys.channels.events, type, data])) as string
}

/** Tells everyone watching a public stream (world chat); like notify, never fails the caller. */
export async function broadcast(deps: NotifyDeps, stream: string, type: EventType, payload: Record<string, unknown>): Promise<void> {
  try {
    await publish(deps, stream, type, payload)
  } catch (error) {
    deps.log.warn('event not published', { type, ...errorFields(error) })
  }
}

/**
 * Many notifications, 1,000 in flight at a time (an invoice run issues thousands). Failures are
 * logged, never thrown; says whether every event was published.
 */
export async function notifyMany(
  deps: NotifyDeps,
  events: { userId: string; type: EventType; payload: Record<string, unknown> }[],
): Promise<boolean> {
  let failed = 0
  let firstError: unknown
  for (let i = 0; i < events.length; i += 1000) {
    const chunk = events.slice(i, i + 1000)
    const settled = await Promise.allSettled(chunk.map(event => publish(deps, deps.keys.events.user(event.userId), event.type, event.payload)))
    for (const outcome of settled) {
      if (outcome.status === 'fulfilled') continue
      failed++
      firstError ??= outcome.reason
    }
  }
  if (failed > 0) deps.log.warn('events not published', { count: failed, of: events.length, ...errorFields(firstError) })
  return failed === 0
}

/**
 * Tells a user something happened. Called after the change is committed; a failure here is logged,
 * never turned into a failure of the change itself.
 */
export async function notify(deps: NotifyDeps, userId: string, type: EventType, payload: Record<string, unknown>): Promise<void> {
  try {
    await publish(deps, deps.keys.events.user(userId), type, payload)
  } catch (error) {
    deps.log.warn('event not published', { type, ...errorFields(error) })
  }
}
