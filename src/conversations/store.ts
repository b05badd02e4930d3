/** SQL for conversation messages and the per-conversation pending state. */
import type { Db } from '../db.ts'

export interface MessageRow {
  id: string
  role: 'user' | 'agent'
  text: string
  createdAt: Date
}

export interface PendingConversation {
  userId: string
  latestMessage: string
  latestMessageAt: string
  pendingCount: number
}

/** A user's message as stored: the conversation's pending count after it, and its time. */
export interface UserMessageStored {
  pendingCount: number
  createdAt: Date
}

/**
 * Records a user's message (the agent's actor applies it). Its time is after the conversation's last
 * message by a millisecond at least, whatever the clock says: a conversation's messages never share
 * a time, which paging by time relies on.
 */
export async function insertUserMessage(
  sql: Db,
  message: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<UserMessageStored> {
  const [row] = await sql<UserMessageStored[]>`
    insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count)
    values (${message.participantId}, ${message.userId}, ${message.text}, ${message.at}, 1)
    on conflict (participant_id, user_id) do update
      set latest_user_message = excluded.latest_user_message,
          latest_user_message_at = greatest(excluded.latest_user_message_at,
            conversations.latest_user_message_at + interval '1 millisecond', conversations.latest_reply_at + interval '1 millisecond'),
          pending_count = conversations.pending_count + 1
    returning pending_count as "pendingCount", latest_user_message_at as "createdAt"
  `
  await sql`
    insert into messages (id, participant_id, user_id, role, text, created_at)
    values (${message.id}, ${message.participantId}, ${message.userId}, 'user', ${message.text}, ${row!.createdAt})
  `
  return row!
}

/** What became of a reply: stored (and whether the conversation was waiting for one), or refused. */
export type ReplyStored = { createdAt: Date; wasPending: boolean } | 'not_found' | 'not_subscribed'

/**
 * Records an agent's reply (the agent's actor applies it), in one statement: it ends the pending
 * state, comes after the conversation's last message, and tells the user through the outbox. A
 * reply needs the user's active subscription, or a message of theirs waiting for it (sent while
 * they subscribed: messages need a subscription).
 */
export async function storeReply(
  sql: Db,
  reply: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<ReplyStored> {
  const { id, participantId, userId, text, at } = reply
  const [row] = await sql<{ allowed: boolean; wasPending: boolean; createdAt: Date | null }[]>`
    with c as (
      select pending_count, latest_user_message_at, latest_reply_at,
        pending_count > 0 or exists (
          select 1 from subscriptions s where s.user_id = ${userId} and s.participant_id = ${participantId} and s.status = 'active'
        ) as allowed
      from conversations where participant_id = ${participantId} and user_id = ${userId}
    ), replied as (
      update conversations v
      set pending_count = 0,
        latest_reply_at = greatest(${at}::timestamptz, c.latest_user_message_at + interval '1 millisecond', c.latest_reply_at + interval '1 millisecond')
      from c
      where c.allowed and v.participant_id = ${participantId} and v.user_id = ${userId}
      returning v.latest_reply_at
    ), stored as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select ${id}, ${participantId}, ${userId}, 'agent', ${text}, latest_reply_at from replied
      returning created_at
    ), announced as (
      insert into outbox (user_id, type, data)
      select ${userId}, 'conversation.reply', json_build_object(
        'type', 'conversation.reply', 'createdAt', ${at.toISOString()}::text,
        'participantId', ${participantId}::text, 'messageId', ${id}::text, 'text', ${text}::text)::text
      from stored
    )
    select c.allowed, c.pending_count > 0 as "wasPending", s.created_at as "createdAt" from c left join stored s on true
  `
  if (!row) return 'not_found'
  if (!row.allowed) return 'not_subscribed'
  return { createdAt: row.createdAt!, wasPending: row.wasPending }
}

/**
 * The agent's pending conversations: what its inbox is rebuilt from (rarely), through the primary
 * key (an index of the pending ones would make every change of the pending state a non-HOT update,
 * sql/00013).
 */
export async function pendingConversations(sql: Db, participantId: string): Promise<PendingConversation[]> {
  const rows = await sql<{ userId: string; latestMessage: string; latestMessageAt: Date; pendingCount: number }[]>`
    select user_id as "userId", latest_user_message as "latestMessage",
      latest_user_message_at as "latestMessageAt", pending_count as "pendingCount"
    from conversations
    where participant_id = ${participantId} and pending_count > 0
  `
  return rows.map(row => ({ ...row, latestMessageAt: row.latestMessageAt.toISOString() }))
}

export async function listMessages(
  sql: Db,
  conversation: { participantId: string; userId: string },
  page: { limit: number; before: Date | undefined },
): Promise<MessageRow[]> {
  return sql<MessageRow[]>`
    select id, role, text, created_at as "createdAt"
    from messages
    where participant_id = ${conversation.participantId} and user_id = ${conversation.userId}
      and (${page.before ?? null}::timestamptz is null or created_at < ${page.before ?? null})
    order by created_at desc, seq desc
    limit ${page.limit}
  `
}
