/** The agent actor's conversation commands: a user's message and the agent's reply. */
import type { ActorKind, CommandContext, Refusal } from '../actors/types.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { participantOwner } from '../participants/store.ts'
import { putPendingConversation, removePendingConversation } from './inbox.ts'
import type { Db, Fragment, TxSql } from '../db.ts'
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
      applyFenced: storeReplies,
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

/** Replies of agents inside a batch's transaction, their fence already passed: at their actors' times. */
async function applyReplies(
  tx: TxSql,
  replies: { payload: UserMessage; context: CommandContext }[],
): Promise<(MessageApplied | Refusal)[]> {
  const fence = tx`
    select * from unnest(${replies.map(r => r.context.actor)}::text[], ${replies.map(r => r.context.at.toISOString())}::timestamptz[]) as f(actor, at)
  `
  const answers = await storeReplies(tx, fence, replies)
  return answers.map(answer => answer!.result)
}

/** Replies of agents, each to one user (so no conversation twice), with their fence: one statement. */
async function storeReplies(
  sql: Db,
  fence: Fragment,
  replies: { payload: UserMessage; context: Omit<CommandContext, 'at'> }[],
): Promise<({ result: MessageApplied | Refusal; at: Date } | undefined)[]> {
  const stored = await insertReplies(
    sql,
    fence,
    replies.map(({ payload, context }) => ({ id: payload.messageId, actor: context.actor, participantId: context.id, userId: payload.userId, text: payload.text })),
  )
  return replies.map(({ payload }) => {
    const reply = stored.get(payload.messageId)
    if (reply === undefined) return undefined
    const { at, wasPending } = reply
    if (!reply.stored) return { result: { refused: 'not_found' }, at }
    const result = { messageId: payload.messageId, userId: payload.userId, text: payload.text, createdAt: at.toISOString(), pendingCount: 0, wasPending }
    return { result, at }
  })
}
