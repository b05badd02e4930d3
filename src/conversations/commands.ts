/** The agent actor's conversation commands: a user's message, and an agent's reply mailed by an older process. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, invalidateInbox, type InboxDeps, putConversation, removeConversation } from './inbox.ts'
import { removalDue } from './replies.ts'
import { insertUserMessage, storeChosenReplies, type ReplyStored } from './store.ts'

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
  /** The conversation's version after it: what its inbox projection is ordered by. */
  version?: number
}

interface ReplyApplied {
  messageId: string
  userId: string
  text: string
  createdAt: string
  /** Absent from results stored before replies left the actor. */
  stored?: ReplyStored
}

export function conversationCommands(deps: InboxDeps): ActorKind {
  const repair = inboxRepair(deps)
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at }): Promise<MessageApplied> {
        const stored = await insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at })
        const ownerId = await participantOwner(tx, id)
        if (ownerId) {
          const payload = { participantId: id, userId: message.userId, messageId: message.messageId, text: message.text }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: 'conversation.message', payload }])
        }
        const createdAt = stored.createdAt.toISOString()
        return { messageId: message.messageId, userId: message.userId, text: message.text, createdAt, pendingCount: stored.pendingCount, version: stored.version }
      },
      async project(result: MessageApplied, _message, { id }) {
        // A result an older process stored (redelivered now) has no version to order it: rebuild the inbox from Postgres.
        if (result.version === undefined) return invalidateInbox(deps, id)
        const conversation = { userId: result.userId, latestMessage: result.text, latestMessageAt: result.createdAt, pendingCount: result.pendingCount }
        await putConversation(deps, id, result.version, conversation)
      },
      repair,
    },
    // Replies are written by the API process that receives them (replies.ts); this drains mail that
    // processes of an older version sent to the actor during an upgrade, the same way.
    'agent.reply': {
      async apply(tx, reply: UserMessage, { id, at }): Promise<ReplyApplied | Refusal> {
        const stored = (await storeChosenReplies(tx, [{ id: reply.messageId, participantId: id, userId: reply.userId, text: reply.text }], at)).get(reply.messageId)
        if (stored instanceof Error) throw stored
        if (!stored) return { refused: 'not_found' }
        // The statement told the user of a reply it stored now (never of a repeat).
        return { messageId: reply.messageId, userId: reply.userId, text: reply.text, createdAt: stored.createdAt.toISOString(), stored }
      },
      async project(result: ReplyApplied, _reply, { id }) {
        if (!result.stored) {
          // Applied by an older process, whose projection has no version to order it: rebuild the inbox from Postgres.
          await invalidateInbox(deps, id)
          return
        }
        const version = removalDue(result.stored)
        if (version !== undefined) await removeConversation(deps, id, result.userId, version)
      },
      repair,
    },
  }
}
