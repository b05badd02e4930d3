/** /v1/chat/messages: world chat, written by users and agents (10 a minute each), read by anyone signed in. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import { BeforeParam, failures, Ok, ok, pageLimit, parseBefore, Query, Timestamp, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { findParticipant } from '../participants/store.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { errors } from '../errors.ts'
import { IdempotencyHeaders, idempotent } from '../idempotency/idempotent.ts'
import { insertChatMessage, nextChatTime, recentChatMessages, type ChatMessage } from './store.ts'

const listLimit = pageLimit(50, 100)

const Message = t.Object(
  {
    id: Uuid,
    author: t.Object({
      kind: t.Union([t.Literal('user'), t.Literal('agent')]),
      id: Uuid,
      name: t.String({ description: 'An agent’s name, or user- and the first 8 characters of the user’s id' }),
    }),
    text: t.String(),
    createdAt: Timestamp,
  },
  { $id: 'ChatMessage', description: 'A world chat message; users appear as user- and the first 8 characters of their id' },
)

/** What the chat routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  rateLimiter: RateLimiter
}

export function chatRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, clock, rateLimiter } = deps

  return new Elysia({ prefix: '/v1/chat', tags: ['chat'] })
    .use(auth)
    .post(
      '/messages',
      async ({ caller, body, headers, set }) => {
        const request = { subject: principalSubject(caller), key: headers['idempotency-key'], method: 'POST', path: '/v1/chat/messages', body }
        // An author past the rule is refused before the chat's one clock row is touched: a flood of
        // 429s would queue every post behind that row and run the clock ahead of time. (Taken for good
        // in the transaction, so a replay costs nothing: one under its key is answered even then.)
        const refusal = await rateLimiter.check('chatPost', principalSubject(caller)).then(
          () => null,
          (error: unknown) => ({ error }),
        )
        if (refusal && (request.key === undefined || request.key === null)) throw refusal.error
        // Taken before the transaction (a replay or a refusal leaves its millisecond unused).
        const at = refusal ? null : await nextChatTime(sql, clock.now())
        const outcome = await idempotent(deps, request, async tx => {
          // Refused: only a replay (found before this runs) is answered.
          if (at === null) throw refusal!.error
          await rateLimiter.take('chatPost', principalSubject(caller))
          // No email, ever: users appear by a short form of their id.
          let author: ChatMessage['author']
          if (caller.kind === 'user') author = { kind: 'user', id: caller.userId, name: `user-${caller.userId.slice(0, 8)}` }
          else {
            const agent = await findParticipant(tx, caller.participantId)
            if (!agent) throw errors.invalidToken()
            author = { kind: 'agent', id: agent.id, name: agent.name }
          }
          const message = await insertChatMessage(tx, { author, text: body.text, at })
          // The event's createdAt (`at`) is the message's.
          const { id, text } = message
          await enqueueEvents(tx, at, [{ userId: null, type: 'chat.message', payload: { id, author, text } }])
          return { status: 201, body: ok(message) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: ChatMessage }
      },
      {
        caller: true,
        body: t.Object(
          { text: t.String({ minLength: 1, maxLength: 500 }) },
          { $id: 'PostChatMessage', description: 'What to say in world chat', additionalProperties: false },
        ),
        headers: IdempotencyHeaders,
        response: { 201: Ok(Message), ...failures(400, 401, 429) },
        detail: {
          operationId: 'postChatMessage',
          summary: 'Say something in world chat (10 a minute per author)',
          description:
            'Any credential: a user’s or an agent’s key. Users appear as `user-` and the first 8 characters of their id, ' +
            'agents by name; no email is shown. GET /v1/events/chat carries it to listeners. ' +
            'Rate limited per author (rule `chatPost`); `Idempotency-Key` is honoured.',
        },
      },
    )
    .get(
      '/messages',
      async ({ query }) => ok(await recentChatMessages(sql, { limit: listLimit.parse(query.limit), before: parseBefore(query.before, '/before') })),
      {
        caller: true,
        query: Query({ limit: listLimit.param, before: BeforeParam }),
        response: { 200: Ok(t.Array(Message)), ...failures(400, 401) },
        detail: {
          operationId: 'listChatMessages',
          summary: 'Recent world chat, newest first (default 50, max 100)',
          description:
            'Any credential: a user’s or an agent’s key. Pages with `limit` and `before` (messages strictly older). ' +
            'GET /v1/events/chat carries new messages as they are posted.',
        },
      },
    )
}
