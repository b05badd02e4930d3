/** An agent's reply to a user, as the agent API takes it: written by this process's reply writer (replies.ts). */
import { newRowId, rowIdFor } from '../ids.ts'
import type { Sql } from '../db.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import { errors } from '../errors.ts'
import type { CommandIdentity } from '../idempotency/idempotent.ts'
import type { Replied, ReplyWriter } from './replies.ts'
import type { PostReply } from './schema.ts'
import { whyNotReplied } from './store.ts'

/** What an agent's reply uses. */
export interface ReplyDeps {
  sql: Sql
  rateLimiter: RateLimiter
  replies: ReplyWriter
}

/**
 * Stores the reply; 404 when the user never wrote to the agent, 403 when they may no longer be written
 * to, 401 when the agent was deactivated since its key was checked, 429 past `replyPost`.
 */
export async function replyAsAgent(
  { replies, rateLimiter, sql }: ReplyDeps,
  agentId: string,
  body: typeof PostReply.static,
  { commandId, reservedAt }: CommandIdentity,
): Promise<Replied> {
  await rateLimiter.take('replyPost', `agent:${agentId}`)
  // Every repeat under one reservation stores (or finds) the same message.
  const chosen = commandId !== undefined && reservedAt !== undefined
  const messageId = chosen ? rowIdFor(reservedAt, commandId) : newRowId()
  const reply = { agentId, userId: body.userId, text: body.text, messageId, chosen }
  for (let attempt = 1; ; attempt++) {
    const replied = await replies.send(reply)
    if (replied) return replied
    const why = await whyNotReplied(sql, agentId, body.userId)
    // The conversation was committed just after the statement looked for it (the user's first
    // message, applied at that moment): stored now, with a statement that sees it.
    if (why === 'arrived' && attempt === 1) continue
    // Its key was revoked with the deactivation: answered as any request with it is from now on.
    if (why === 'inactive') throw errors.invalidToken()
    if (why === 'not_subscribed') throw errors.notSubscribed()
    throw errors.notFound('Conversation')
  }
}
