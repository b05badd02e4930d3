/** /v1/events/stream (a user's notifications) and /v1/events/chat (world chat, public): server-sent events. */
import { Elysia, t } from 'elysia'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { Config } from '../config.ts'
import type { Authenticator } from '../auth/authenticator.ts'
import type { EventHub, ReplayBudget } from './hub.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { RateLimitName } from '../config.ts'
import { errors } from '../errors.ts'
import { ErrorBody, Query } from '../http/schema.ts'
import { userKeyHash } from '../auth/authenticator.ts'
import { spendSseToken } from '../auth/sse-token.ts'
import { isEventId, maxStreamsPerUser, streamHeaders, type OpenOptions } from './hub.ts'
import { addressBucket, clientIpResolver } from '../http/client-ip.ts'

// Documented by hand: the plugin would call a string body text/plain.
const streamResponses = (...statuses: number[]) => ({
  200: {
    description:
      '`retry: 3000`; opened without a last event id, then `id:` alone (the place it starts from, to resume from, no event); then events with `id:`, `event:` (the type) and `data:` (JSON with type, createdAt and the payload); `: ping` at least every 5 s. ' +
      'A resume from an event of the last 24 h the stream no longer holds (Redis lost it, or more than 1,000 came since), or from `0-0` ' +
      '(an empty stream’s place) with more than 1,000 since, is sent `event: events.missed` first, ' +
      "with `id:` the resume's own place and data `{type, createdAt, after}`: events after `after` may be missing, re-read what they tell of",
    content: { 'text/event-stream': { schema: { type: 'string' as const } } },
  },
  ...Object.fromEntries(statuses.map(status => [status, { description: 'Error', content: { 'application/json': { schema: ErrorBody } } }])),
})

const Resume = Query({
  lastEventId: t.Optional(t.String({ description: 'Resume after this event id (or send the Last-Event-ID header)' })),
})

/** The header an EventSource sends when it reconnects (the query's `lastEventId` does the same). */
const ResumeHeaders = t.Object({
  'last-event-id': t.Optional(t.String({ description: 'Resume after this event id: the last `id:` received' })),
})

/** HEAD (safe, RFC 9110): what a GET would answer, without a stream to hold or a token to spend. */
function streamHead(lastEventId: string | undefined): Response {
  if (lastEventId && !isEventId(lastEventId)) throw errors.invalidCursor()
  return new Response(null, { headers: streamHeaders })
}

/** What the event streams use; Redis and clock to spend SSE tokens. */
export interface RouteDeps {
  redis: Redis
  keys: Keys
  clock: Clock
  config: Config
  authenticator: Authenticator
  events: EventHub
  rateLimiter: RateLimiter
}

export function eventRoutes(deps: RouteDeps) {
  const { authenticator, events, keys } = deps
  const clientIp = clientIpResolver(deps.config.trustedProxies)
  /** Resumes' replays counted by a rate rule, per user (`streamReplay`) or address (`chatReplay`). */
  const budgetOf = (rule: RateLimitName, subject: string): ReplayBudget => ({
    check: () => deps.rateLimiter.check(rule, subject),
    spend: events => deps.rateLimiter.spend(rule, subject, events),
  })

  /**
   * Opens a stream with its connection's idle timeout lifted (pings keep it busy), and puts it back
   * if the stream is refused (400, 429, 503): left lifted, the kept-alive connection could idle for good.
   */
  const openStream = async (request: Request, server: { timeout(request: Request, seconds: number): void } | null, options: OpenOptions) => {
    server?.timeout(request, 0)
    try {
      return await events.open(options)
    } catch (error) {
      server?.timeout(request, deps.config.httpIdleTimeoutS)
      throw error
    }
  }

  return new Elysia({ prefix: '/v1/events', tags: ['events'] })
    .get(
      '/stream',
      async ({ request, query, server }) => {
        const lastEventId = request.headers.get('last-event-id') || query.lastEventId
        let userId: string
        // The API key the stream was opened with, if one: revoking it ends the stream.
        let keyHash: string | null
        if (query.token !== undefined) {
          // A bad cursor is refused before the one-use token is spent on it.
          if (lastEventId && !isEventId(lastEventId)) throw errors.invalidCursor()
          // The one-use token opens this stream only; it is never a credential anywhere else.
          const spent = await spendSseToken(deps, query.token, { spend: request.method !== 'HEAD' })
          if (!spent) throw errors.invalidToken('The stream token is unknown, used or expired')
          // GET refuses a token asked for with a key revoked since, as the stream opens: a HEAD says so too.
          if (request.method === 'HEAD' && spent.keyHash && typeof (await authenticator.keys.lookup(spent.keyHash)) !== 'object') {
            throw errors.invalidToken('The API key this stream was asked for with has been revoked')
          }
          userId = spent.userId
          keyHash = spent.keyHash
        } else {
          const principal = await authenticator.authenticate(request, server)
          if (!principal) throw errors.unauthorized()
          if (principal.kind !== 'user') throw errors.userOnly()
          userId = principal.userId
          keyHash = userKeyHash(request.headers)
        }
        if (request.method === 'HEAD') return streamHead(lastEventId)
        return openStream(request, server, {
          stream: keys.events.user(userId),
          lastEventId,
          limit: { subject: userId, max: maxStreamsPerUser },
          keyHash,
          replayBudget: budgetOf('streamReplay', userId),
        })
      },
      {
        query: Query({
          token: t.Optional(t.String({ description: 'A one-use token from POST /v1/auth/sse-token (instead of a header)' })),
          lastEventId: Resume.properties.lastEventId,
        }),
        headers: ResumeHeaders,
        detail: {
          operationId: 'notificationStream',
          summary: 'Your notifications as server-sent events (at most 5 open streams per user)',
          description:
            'Needs a user credential as `Authorization: Bearer`, or a one-use `token` from POST /v1/auth/sse-token; ' +
            'an agent key is 403. Resume with `Last-Event-ID` or `lastEventId`: later events are replayed (the last 1,000, up ' +
            'to 24 h), then live ones. A sixth stream is 429 with `Retry-After`, and so is a resume once the events replayed ' +
            'to the user pass the rule `streamReplay` (5,000 per 10 minutes by default). A stream opened with an API key ends when ' +
            'the key is revoked.',
          security: [{ bearer: [] }, { sseToken: [] }],
          responses: streamResponses(400, 401, 403, 429),
        },
      },
    )
    .get(
      '/chat',
      async ({ request, query, server }) => {
        const lastEventId = request.headers.get('last-event-id') || query.lastEventId
        if (request.method === 'HEAD') return streamHead(lastEventId)
        const max = deps.config.chatStreamsPerAddress
        const address = `ip:${addressBucket(clientIp(server, request))}`
        const limit = max > 0 ? { subject: address, max } : undefined
        const replayBudget = budgetOf('chatReplay', address)
        return openStream(request, server, { stream: keys.events.chat, lastEventId, limit, replayBudget })
      },
      {
        query: Resume,
        headers: ResumeHeaders,
        detail: {
          operationId: 'chatStream',
          summary: 'World chat as server-sent events (public)',
          description:
            'No credential. Each message posted with POST /v1/chat/messages arrives as an event. ' +
            'Resume with `Last-Event-ID` or `lastEventId`: later events are replayed (the last 1,000, up to 24 h), then live ' +
            'ones. An id not of the form `<ms>-<seq>`, or more than an hour ahead, is 400 `invalid_cursor`. One client address holds at most ' +
            'CHAT_STREAMS_PER_ADDRESS chat streams at once (100 by default; an IPv6 one by its /64); past that 429 `rate_limited`, ' +
            'as is a resume once the events replayed to the address pass the rule `chatReplay` (10,000 per 10 minutes by default).',
          security: [],
          responses: streamResponses(400, 429),
        },
      },
    )
}
