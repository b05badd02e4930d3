/** The agent actor's conversation commands: a user's message and the agent's reply. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { participantOwner } from '../participants/store.ts'
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
  /** Who to tell: the agent's owner of a user's message. */
  ownerId?: string
}

export function conversationCommands(deps: NotifyDeps): ActorKind {
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at }): Promise<MessageApplied> {
        const pendingCount = await insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at })
        const ownerId = await participantOwner(tx, id)
        return { messageId: message.messageId, userId: message.userId, text: message.text, createdAt: at.toISOString(), pendingCount, ownerId }
      },
      async project(result: MessageApplied, _message, { id }) {
        await putPendingConversation(deps, id, {
          userId: result.userId,
          latestMessage: result.text,
          latestMessageAt: result.createdAt,
          pendingCount: result.pendingCount,
        })
        if (result.ownerId) {
          await notify(deps, result.ownerId, 'conversation.message', {
            participantId: id,
            userId: result.userId,
            messageId: result.messageId,
            text: result.text,
          })
        }
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
        await notify(deps, result.userId, 'conversation.reply', { participantId: id, messageId: result.messageId, text: result.text })
      },
    },
  }
}
