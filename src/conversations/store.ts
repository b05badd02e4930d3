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
  const [row] = await sql<{ pendingCount: number }[]>`
    insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count)
    values (${message.participantId}, ${message.userId}, ${message.text}, ${message.at}, 1)
    on conflict (participant_id, user_id) do update
      set latest_user_message = excluded.latest_user_message,
          latest_user_message_at = excluded.latest_user_message_at,
          pending_count = conversations.pending_count + 1
    returning pending_count as "pendingCount"
  `
  await sql`
    insert into messages (id, participant_id, user_id, role, text, created_at)
    values (${message.id}, ${message.participantId}, ${message.userId}, 'user', ${message.text}, ${message.at})
  `
  return row!.pendingCount
}

/**
 * Records agents' replies (no two to one conversation) in one statement and ends the conversations'
 * pending state. Returns, by message id, whether the conversation was pending before; a reply to a
 * user who never wrote to the agent is not stored and not in the map.
 */
export async function insertReplies(
  sql: Db,
  replies: { id: string; participantId: string; userId: string; text: string; at: Date }[],
): Promise<Map<string, boolean>> {
  // `before` is the row as this statement found it: only the agent's own commands change it, one at a time.
  const rows = await sql<{ id: string; wasPending: boolean }[]>`
    with input as (
      select * from json_to_recordset(${JSON.stringify(replies)}::text::json)
        as i(id uuid, "participantId" uuid, "userId" uuid, text text, at timestamptz)
    ), replied as (
      update conversations c set latest_reply_at = i.at, pending_count = 0
      from input i, conversations before
      where c.participant_id = i."participantId" and c.user_id = i."userId"
        and before.participant_id = c.participant_id and before.user_id = c.user_id
      returning c.participant_id, c.user_id, before.pending_count > 0 as was_pending
    ), stored as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select i.id, i."participantId", i."userId", 'agent', i.text, i.at
      from input i join replied r on r.participant_id = i."participantId" and r.user_id = i."userId"
      returning id, participant_id, user_id
    )
    select s.id, r.was_pending as "wasPending"
    from stored s join replied r on r.participant_id = s.participant_id and r.user_id = s.user_id
  `
  return new Map(rows.map(row => [row.id, row.wasPending]))
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
