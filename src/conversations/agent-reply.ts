/** An agent's reply to a user, as the agent API takes it: a command of the agent's actor (commands.ts). */
import { newRowId } from '../ids.ts'
import type { Deps } from '../deps.ts'
import { errors } from '../errors.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import type { CommandIdentity } from '../idempotency/idempotent.ts'
import type { AgentReply, Replied } from './commands.ts'
import type { PostReply } from './schema.ts'

/** Stores the reply; 404 when the user never wrote to the agent, 403 when they may no longer be written to, 429 past `replyPost`. */
export async function replyAsAgent(
  { dispatcher, rateLimiter }: Deps,
  agentId: string,
  body: typeof PostReply.static,
  identity: CommandIdentity,
): Promise<Omit<Replied, 'answered'>> {
  await rateLimiter.take('replyPost', `agent:${agentId}`)
  const command: AgentReply = { messageId: newRowId(), userId: body.userId, text: body.text }
  const { messageId, userId, text, createdAt } = accepted(
    await dispatcher.ask<Replied | Refusal>(`agent:${agentId}`, 'agent.reply', command, identity),
    () => errors.notFound('Conversation'),
  )
  return { messageId, userId, text, createdAt }
}
