/** POST /v1/agent/conversation-reply: an agent answers a user (documented with the conversations). */
import { Elysia } from 'elysia'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import type { ReplyDeps } from '../conversations/agent-reply.ts'
import { failures, Ok, ok } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { replyAsAgent } from '../conversations/agent-reply.ts'
import { PostReply, Reply } from '../conversations/schema.ts'

export function conversationReplyRoutes(deps: ReplyDeps & { clock: Clock; log: Log }, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['conversations'] }).use(auth).post(
    '/conversation-reply',
    async ({ agent, body, headers, set }) => {
      const request = {
        subject: principalSubject(agent),
        key: headers['idempotency-key'],
        method: 'POST',
        path: '/v1/agent/conversation-reply',
        body,
      }
      const outcome = await idempotentCommand(deps, request, async identity => ({
        status: 201,
        body: ok(await replyAsAgent(deps, agent.participantId, body, identity)),
      }))
      set.status = outcome.status
      return outcome.body as { success: true; data: typeof Reply.static }
    },
    {
      agent: true,
      body: PostReply,
      headers: IdempotencyHeaders,
      response: { 201: Ok(Reply), ...failures(400, 401, 403, 404, 409, 429, 503) },
      detail: {
        operationId: 'replyToConversation',
        summary: 'Reply to a user; the conversation stops being pending (honours Idempotency-Key; replyPost rate per agent)',
        description:
          'Needs the agent’s key (`X-API-Key` or bearer `sk_agt_`); a user credential is 403. An agent deactivated ' +
          'meanwhile stores nothing: 401 `invalid_token`, as its revoked key is answered from then on. ' +
          'A user who never wrote to the agent is 404; one no longer subscribed, with no message waiting, is 403 ' +
          '`not_subscribed`. The user gets `conversation.reply`. On 503, retry with the same `Idempotency-Key`: the reply ' +
          'is stored once.',
      },
    },
  )
}
