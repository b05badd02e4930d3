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

/** Records a user's message and returns the conversation's pending count after it. */
export async function insertUserMessage(
  sql: Db,
  message: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<number> {
  await sql`
    insert into messages (id, participant_id, user_id, role, text, created_at)
    values (${message.id}, ${message.participantId}, ${message.userId}, 'user', ${message.text}, ${message.at})
  `
  const [row] = await sql<{ pendingCount: number }[]>`
    insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count)
    values (${message.participantId}, ${message.userId}, ${message.text}, ${message.at}, 1)
    on conflict (participant_id, user_id) do update
      set latest_user_message = excluded.latest_user_message,
          latest_user_message_at = excluded.latest_user_message_at,
          pending_count = conversations.pending_count + 1
    returning pending_count as "pendingCount"
  `
  return row!.pendingCount
}

/** Records an agent's reply; false when the user never wrote to the agent. */
export async function insertReply(
  sql: Db,
  reply: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<boolean> {
  const rows = await sql`
    with replied as (
      update conversations set latest_reply_at = ${reply.at}, pending_count = 0
      where participant_id = ${reply.participantId} and user_id = ${reply.userId}
      returning participant_id, user_id
    )
    insert into messages (id, participant_id, user_id, role, text, created_at)
    select ${reply.id}, participant_id, user_id, 'agent', ${reply.text}, ${reply.at} from replied
    returning 1
  `
  return rows.length === 1
}

/** The agent's conversations waiting for a reply, oldest first: what its inbox is rebuilt from. */
export async function pendingConversations(sql: Db, participantId: string): Promise<PendingConversation[]> {
  const rows = await sql<{ userId: string; latestMessage: string; latestMessageAt: Date; pendingCount: number }[]>`
    select user_id as "userId", latest_user_message as "latestMessage",
      latest_user_message_at as "latestMessageAt", pending_count as "pendingCount"
    from conversations
    where participant_id = ${participantId} and pending_count > 0
    order by latest_user_message_at
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
