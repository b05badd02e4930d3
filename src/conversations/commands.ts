/** The agent actor's conversation commands: a user's message, and the agent's reply. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, type InboxDeps, writeConversation } from './inbox.ts'
import { insertUserMessage, storeReply } from './store.ts'

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

export interface AgentReply {
  messageId: string
  userId: string
  text: string
}

export interface Replied {
  messageId: string
  userId: string
  text: string
  createdAt: string
  /** The reply ended the conversation's pending state: the inbox is to drop it. */
  answered: boolean
}

export function conversationCommands(deps: InboxDeps): ActorKind {
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at }): Promise<MessageApplied> {
        const stored = await insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at })
        const ownerId = await participantOwner(tx, id)
        if (ownerId) {
          const payload = { participantId: id, userId: message.userId, messageId: message.messageId, text: message.text }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: 'conversation.message', payload }])
        }
        const { messageId, userId, text } = message
        return { messageId, userId, text, createdAt: stored.createdAt.toISOString(), pendingCount: stored.pendingCount }
      },
      async project(result: MessageApplied, _message, { id, fence }) {
        const pending = { userId: result.userId, latestMessage: result.text, latestMessageAt: result.createdAt, pendingCount: result.pendingCount }
        await writeConversation(deps, id, fence, result.userId, pending)
      },
      repair: inboxRepair(deps),
    },
    'agent.reply': {
      async apply(tx, reply: AgentReply, { id, at }): Promise<Replied | Refusal> {
        const stored = await storeReply(tx, { id: reply.messageId, participantId: id, userId: reply.userId, text: reply.text, at })
        if (typeof stored === 'string') return { refused: stored }
        const { messageId, userId, text } = reply
        return { messageId, userId, text, createdAt: stored.createdAt.toISOString(), answered: stored.wasPending }
      },
      async project(result: Replied, _reply, { id, fence }) {
        if (result.answered) await writeConversation(deps, id, fence, result.userId, null)
      },
      repair: inboxRepair(deps),
    },
  }
}
