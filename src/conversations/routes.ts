/** Conversations: subscribers write to agents and read the history (agents reply through the agent API). */
import { newRowId } from '../ids.ts'
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { Dispatcher } from '../actors/dispatcher.ts'
import { errors, inOrder } from '../errors.ts'
import { BeforeParam, failures, iso, Ok, ok, pageLimit, parseBefore, Query, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import { findParticipant } from '../participants/store.ts'
import { hasActiveSubscription } from '../billing/subscriptions/store.ts'
import type { MessageApplied, UserMessage } from './commands.ts'
import { Message, PostMessage } from './schema.ts'
import { listMessages } from './store.ts'

const listLimit = pageLimit(50, 100)

/** What the conversation routes use; clock and log for idempotent commands. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  log: Log
  rateLimiter: RateLimiter
  dispatcher: Dispatcher
}

export function conversationRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, dispatcher, rateLimiter } = deps

  const activeAgent = async (agentId: string) => {
    const agent = await findParticipant(sql, agentId)
    if (!agent || agent.id !== agentId) throw errors.notFound('Agent')
    return agent
  }

  return new Elysia({ tags: ['conversations'] })
    .use(auth)
    .post(
      '/v1/conversations/:agentId/messages',
      async ({ user, params, body, headers, set }) => {
        const request = {
          subject: principalSubject(user),
          key: headers['idempotency-key'],
          method: 'POST',
          path: `/v1/conversations/${params.agentId}/messages`,
          body,
        }
        const outcome = await idempotentCommand(deps, request, async identity => {
          // The rate first, alone: a caller past it costs Redis one call and PostgreSQL nothing.
          await rateLimiter.take('messagePost', principalSubject(user))
          const [, subscribed] = await inOrder([activeAgent(params.agentId), hasActiveSubscription(sql, user.userId, params.agentId)] as const)
          if (!subscribed) throw errors.notSubscribed()
          const command: UserMessage = { messageId: newRowId(), userId: user.userId, text: body.text }
          const answer = await dispatcher.ask<MessageApplied | Refusal>(`agent:${params.agentId}`, 'user.message', command, identity)
          // Refused when the agent was deactivated since it was found above.
          const result = accepted(answer, () => errors.notFound('Agent'))
          return { status: 201, body: ok({ id: result.messageId, role: 'user' as const, text: result.text, createdAt: result.createdAt }) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof Message.static }
      },
      {
        user: true,
        params: t.Object({ agentId: Uuid }),
        body: PostMessage,
        headers: IdempotencyHeaders,
        response: { 201: Ok(Message), ...failures(400, 401, 403, 404, 409, 429, 503) },
        detail: {
          operationId: 'sendMessage',
          summary: 'Write to an agent you subscribe to (honours Idempotency-Key; messagePost rate per user)',
          description:
            'Needs a user credential with an active subscription to the agent (else 403 `not_subscribed`); ' +
            'an unknown or deactivated agent is 404. The conversation shows as pending in the agent’s GET /v1/agent/events, ' +
            'and the owner gets `conversation.message`. On 503, retry with the same `Idempotency-Key`: the message is stored ' +
            'once.',
        },
      },
    )
    .get(
      '/v1/conversations/:agentId/messages',
      async ({ user, params, query }) => {
        await activeAgent(params.agentId)
        const page = { limit: listLimit.parse(query.limit), before: parseBefore(query.before, '/before') }
        const rows = await listMessages(sql, { participantId: params.agentId, userId: user.userId }, page)
        return ok(rows.map(row => ({ id: row.id, role: row.role, text: row.text, createdAt: iso(row.createdAt) })))
      },
      {
        user: true,
        params: t.Object({ agentId: Uuid }),
        query: Query({ limit: listLimit.param, before: BeforeParam }),
        response: { 200: Ok(t.Array(Message)), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'listMessages',
          summary: 'Your conversation with an agent, both roles, newest first (default 50, max 100)',
          description:
            'Needs a user credential; shows only the caller’s own conversation. Pages with `limit` and `before` (messages ' +
            'strictly older). Reading needs no active subscription. An unknown or deactivated agent is 404.',
        },
      },
    )
}
