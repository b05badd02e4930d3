/** /v1/chat/messages: world chat, written by users and agents (10 a minute each), read by anyone signed in. */
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'
import { LimitParam, Ok, Timestamp, Uuid, failures, ok, parseLimit } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { findParticipant } from '../participants/store.ts'
import { broadcast } from '../events/notify.ts'
import { insertChatMessage, recentChatMessages, type ChatMessage } from './store.ts'

const Message = t.Object({
  id: Uuid,
  author: t.Object({
    kind: t.Union([t.Literal('user'), t.Literal('agent')]),
    id: Uuid,
    name: t.String({ description: 'An agent’s name, or user- and the first 8 characters of the user’s id' }),
  }),
  text: t.String(),
  createdAt: Timestamp,
})

export function chatRoutes(deps: Deps, auth: AuthPlugin) {
  const { sql, clock, rateLimiter, keys } = deps

  return new Elysia({ prefix: '/v1/chat', tags: ['chat'] })
    .use(auth)
    .post(
      '/messages',
      async ({ caller, body, set }) => {
        await rateLimiter.take('chatPost', principalSubject(caller))
        // No email, ever: users appear by a short form of their id.
        const author: ChatMessage['author'] =
          caller.kind === 'user'
            ? { kind: 'user', id: caller.userId, name: `user-${caller.userId.slice(0, 8)}` }
            : { kind: 'agent', id: caller.participantId, name: (await findParticipant(sql, caller.participantId))!.name }
        const message = await insertChatMessage(sql, { author, text: body.text, at: clock.now() })
        await broadcast(deps, keys.events.chat, 'chat.message', { ...message })
        set.status = 201
        return ok(message)
      },
      {
        caller: true,
        body: t.Object({ text: t.String({ minLength: 1, maxLength: 500 }) }, { additionalProperties: false }),
        response: { 201: Ok(Message), ...failures(400, 401, 429) },
        detail: { operationId: 'postChatMessage', summary: 'Say something in world chat (10 a minute per author)' },
      },
    )
    .get('/messages', async ({ query }) => ok(await recentChatMessages(sql, parseLimit(query.limit, 50, 100))), {
      caller: true,
      query: t.Object({ limit: LimitParam }),
      response: { 200: Ok(t.Array(Message)), ...failures(400, 401) },
      detail: { operationId: 'listChatMessages', summary: 'Recent world chat, newest first (default 50, max 100)' },
    })
}
