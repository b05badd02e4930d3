/** The agent actor's conversation commands: a user's message, and an agent's reply mailed by an older process. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, invalidateInbox, putConversation, removeConversation } from './inbox.ts'
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
  /** Who to tell: the agent's owner of a user's message. */
  ownerId?: string
}

interface ReplyApplied {
  messageId: string
  userId: string
  text: string
  createdAt: string
  /** Absent from results stored before replies left the actor. */
  stored?: ReplyStored
}

export function conversationCommands(deps: NotifyDeps): ActorKind {
  const repair = inboxRepair(deps)
  return {
    'user.message': {
      async apply(tx, message: UserMessage, { id, at }): Promise<MessageApplied> {
        const stored = await insertUserMessage(tx, { id: message.messageId, participantId: id, userId: message.userId, text: message.text, at })
        const ownerId = await participantOwner(tx, id)
        const createdAt = stored.createdAt.toISOString()
        return { messageId: message.messageId, userId: message.userId, text: message.text, createdAt, pendingCount: stored.pendingCount, version: stored.version, ownerId }
      },
      async project(result: MessageApplied, _message, { id }) {
        // A result an older process stored (redelivered now) has no version to order it: rebuild the inbox from Postgres.
        if (result.version === undefined) return invalidateInbox(deps, id)
        const conversation = { userId: result.userId, latestMessage: result.text, latestMessageAt: result.createdAt, pendingCount: result.pendingCount }
        await putConversation(deps, id, result.version, conversation)
      },
      repair,
      async announce(result: MessageApplied, _message, { id }) {
        if (!result.ownerId) return
        await notify(deps, result.ownerId, 'conversation.message', {
          participantId: id,
          userId: result.userId,
          messageId: result.messageId,
          text: result.text,
        })
      },
    },
    // Replies are written by the API process that receives them (replies.ts); this drains mail that
    // processes of an older version sent to the actor during an upgrade, the same way.
    'agent.reply': {
      async apply(tx, reply: UserMessage, { id, at }): Promise<ReplyApplied | Refusal> {
        const stored = (await storeChosenReplies(tx, [{ id: reply.messageId, participantId: id, userId: reply.userId, text: reply.text }], at)).get(reply.messageId)
        if (stored instanceof Error) throw stored
        if (!stored) return { refused: 'not_found' }
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
      async announce(result: ReplyApplied, _reply, { id }) {
        await notify(deps, result.userId, 'conversation.reply', { participantId: id, messageId: result.messageId, text: result.text })
      },
    },
  }
}
