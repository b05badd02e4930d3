/** The agent actor's conversation commands: a user's message and the agent's reply. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { putPendingConversation, removePendingConversation } from './inbox.ts'
import { insertReply, insertUserMessage } from './store.ts'

export interface UserMessage {
  messageId: string
  userId: string
  text: string
}

export interface MessageApplied {
  messageId: string
  userId: string
  text: string
  createdAt: string
  pendingCount: number
}

export function conversationCommands(deps: { redis: Redis; keys: Keys }): ActorKind {
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at }): Promise<MessageApplied> {
        const pendingCount = await insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at })
        return { messageId: message.messageId, userId: message.userId, text: message.text, createdAt: at.toISOString(), pendingCount }
      },
      async project(result: MessageApplied, _message, { id }) {
        await putPendingConversation(deps, id, {
          userId: result.userId,
          latestMessage: result.text,
          latestMessageAt: result.createdAt,
          pendingCount: result.pendingCount,
        })
      },
    },
    'agent.reply': {
      async apply(tx, reply: UserMessage, { id, at }): Promise<MessageApplied | Refusal> {
        const replied = await insertReply(tx, { id: reply.messageId, participantId: id, userId: reply.userId, text: reply.text, at })
        if (!replied) return { refused: 'not_found' }
        return { messageId: reply.messageId, userId: reply.userId, text: reply.text, createdAt: at.toISOString(), pendingCount: 0 }
      },
      async project(result: MessageApplied, _reply, { id }) {
        await removePendingConversation(deps, id, result.userId)
      },
    },
  }
}
