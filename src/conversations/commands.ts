/** The agent actor's conversation command: a user's message. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, type InboxDeps, writeConversation } from './inbox.ts'
import { insertUserMessage } from './store.ts'

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
  /** The conversation's version after it: what its inbox write is ordered by. */
  version: number
}

export function conversationCommands(deps: InboxDeps): ActorKind {
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at, passed }): Promise<MessageApplied | Refusal> {
        // Sent together on the turn's connection: one round trip, not two, while the turn holds its rows.
        const [stored, ownerId] = await Promise.all([
          insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at }),
          participantOwner(tx, id),
        ])
        // Deactivated since the route found it (the message waited in the mailbox): nothing stored.
        if (!stored) return { refused: 'not_found' }
        // After the conversation's last reply, whose time (another process's clock) may be ahead of
        // the actor's: the agent's later messages and requests come after it, or a poll's `since`
        // past this one would skip them.
        passed?.(stored.createdAt)
        if (ownerId) {
          const payload = { participantId: id, userId: message.userId, messageId: message.messageId, text: message.text }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: 'conversation.message', payload }])
        }
        const createdAt = stored.createdAt.toISOString()
        return {
          messageId: message.messageId,
          userId: message.userId,
          text: message.text,
          createdAt,
          pendingCount: stored.pendingCount,
          version: stored.version,
        }
      },
      async project(result: MessageApplied, _message, { id }) {
        const pending = { userId: result.userId, latestMessage: result.text, latestMessageAt: result.createdAt, pendingCount: result.pendingCount }
        await writeConversation(deps, id, result.userId, result.version, pending)
      },
      repair: inboxRepair(deps),
    },
  }
}
