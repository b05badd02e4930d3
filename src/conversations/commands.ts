/** The agent actor's conversation commands: a user's message and the agent's reply. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { participantOwner } from '../participants/store.ts'
import { putPendingConversation, removePendingConversation } from './inbox.ts'
import type { TxSql } from '../db.ts'
import { insertReplies, insertUserMessage } from './store.ts'

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
  /** Of a reply: the conversation was waiting for it (else the agent's inbox has nothing to drop). */
  wasPending?: boolean
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
      },
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
    'agent.reply': {
      async apply(tx, reply: UserMessage, context): Promise<MessageApplied | Refusal> {
        const [result] = await applyReplies(tx, [{ payload: reply, context }])
        return result!
      },
      applyMany: applyReplies,
      async project(result: MessageApplied, _reply, { id }) {
        // A result stored before this field existed says nothing: drop the entry to be sure.
        if (result.wasPending !== false) await removePendingConversation(deps, id, result.userId)
      },
      async announce(result: MessageApplied, _reply, { id }) {
        await notify(deps, result.userId, 'conversation.reply', { participantId: id, messageId: result.messageId, text: result.text })
      },
    },
  }
}

/** Replies of agents, each to one user (so no conversation twice), in one statement. */
async function applyReplies(
  tx: TxSql,
  replies: { payload: UserMessage; context: { id: string; at: Date } }[],
): Promise<(MessageApplied | Refusal)[]> {
  const stored = await insertReplies(
    tx,
    replies.map(({ payload, context }) => ({ id: payload.messageId, participantId: context.id, userId: payload.userId, text: payload.text, at: context.at })),
  )
  return replies.map(({ payload, context }) => {
    const wasPending = stored.get(payload.messageId)
    if (wasPending === undefined) return { refused: 'not_found' }
    return { messageId: payload.messageId, userId: payload.userId, text: payload.text, createdAt: context.at.toISOString(), pendingCount: 0, wasPending }
  })
}
