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

/** A user's message as stored: the conversation's pending count and version after it, and its time. */
export interface UserMessageStored {
  pendingCount: number
  version: number
  createdAt: Date
}

/**
 * Records a user's message, raising the conversation's version. Its time is never before the
 * conversation's last message, whose time may come from another process's clock (a reply's).
 */
export async function insertUserMessage(
  sql: Db,
  message: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<UserMessageStored> {
  const [row] = await sql<UserMessageStored[]>`
    insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count, version)
    values (${message.participantId}, ${message.userId}, ${message.text}, ${message.at}, 1, 1)
    on conflict (participant_id, user_id) do update
      set latest_user_message = excluded.latest_user_message,
          latest_user_message_at = greatest(excluded.latest_user_message_at, conversations.latest_user_message_at, conversations.latest_reply_at),
          pending_count = conversations.pending_count + 1,
          version = conversations.version + 1
    returning pending_count as "pendingCount", version, latest_user_message_at as "createdAt"
  `
  await sql`
    insert into messages (id, participant_id, user_id, role, text, created_at)
    values (${message.id}, ${message.participantId}, ${message.userId}, 'user', ${message.text}, ${row!.createdAt})
  `
  return row!
}

export interface NewReply {
  id: string
  participantId: string
  userId: string
  text: string
  /** The sender chose the id (an Idempotency-Key): it may have been stored by an earlier attempt. */
  chosen: boolean
}

/** A conversation's state as a writer found it, with its version. */
export interface ConversationState {
  version: number
  pendingCount: number
  latestMessage: string | null
  latestMessageAt: Date | null
}

/**
 * What became of a reply: stored now (with the conversation's new version when it was waiting for a
 * reply, and so changed), or stored before under the same id (a repeat: nothing changed, and the
 * conversation stands as `conversation` says).
 */
export type ReplyStored =
  | { stored: true; createdAt: Date; version: number | null }
  | { stored: false; createdAt: Date; conversation: ConversationState }

/**
 * Records agents' replies (no two to one conversation) at `at` in one statement. A pending
 * conversation stops being pending and its version rises; its row lock orders the reply against the
 * user's messages and other replies, and the reply's time is never before its last message (whose
 * time may come from another process's clock). A conversation that was not pending is not written.
 * A reply whose chosen id is already stored changes nothing. A reply to a user who never wrote to
 * the agent is not in the map.
 */
export async function storeReplies(sql: Db, replies: NewReply[], at: Date): Promise<Map<string, ReplyStored>> {
  const rows = await sql<{ id: string; createdAt: Date | null; version: number | null }[]>`
    with input as (
      select * from json_to_recordset(${JSON.stringify(replies)}::text::json)
        as i(id uuid, "participantId" uuid, "userId" uuid, text text, chosen boolean)
    ), found as (
      select i.id, i."participantId", i."userId", i.text, c.latest_user_message_at, c.latest_reply_at
      from input i join conversations c on c.participant_id = i."participantId" and c.user_id = i."userId"
    ), replied as (
      update conversations c
      set pending_count = 0, version = c.version + 1,
        latest_reply_at = greatest(${at}::timestamptz, c.latest_user_message_at, c.latest_reply_at)
      from input i
      where c.participant_id = i."participantId" and c.user_id = i."userId" and c.pending_count > 0
        and not (i.chosen and exists (select from messages m where m.id = i.id))
      returning c.participant_id, c.user_id, c.version, c.latest_reply_at
    ), stored as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select f.id, f."participantId", f."userId", 'agent', f.text,
        coalesce(r.latest_reply_at, greatest(${at}::timestamptz, f.latest_user_message_at, f.latest_reply_at))
      from found f left join replied r on r.participant_id = f."participantId" and r.user_id = f."userId"
      on conflict (id) do nothing
      returning id, created_at
    )
    select f.id, s.created_at as "createdAt", r.version
    from found f
    left join stored s on s.id = f.id
    left join replied r on r.participant_id = f."participantId" and r.user_id = f."userId"
  `
  const outcomes = new Map<string, ReplyStored>()
  const repeats: string[] = []
  for (const row of rows) {
    if (row.createdAt) outcomes.set(row.id, { stored: true, createdAt: row.createdAt, version: row.version })
    else repeats.push(row.id)
  }
  if (repeats.length > 0) {
    // Stored by an earlier attempt, perhaps after this statement began: read it, and where its conversation stands, afresh.
    const earlier = await sql<({ id: string; createdAt: Date } & ConversationState)[]>`
      select m.id, m.created_at as "createdAt", c.version, c.pending_count as "pendingCount",
        c.latest_user_message as "latestMessage", c.latest_user_message_at as "latestMessageAt"
      from messages m join conversations c on c.participant_id = m.participant_id and c.user_id = m.user_id
      where m.id = any(${repeats}::uuid[])
    `
    for (const { id, createdAt, ...conversation } of earlier) outcomes.set(id, { stored: false, createdAt, conversation })
    for (const id of repeats) if (!outcomes.has(id)) throw new Error(`reply ${id} conflicted with a message that is not there`)
  }
  return outcomes
}

/** The agent's conversations waiting for a reply, oldest first, with their versions: what its inbox is rebuilt from. */
export async function pendingConversations(sql: Db, participantId: string): Promise<(PendingConversation & { version: number })[]> {
  const rows = await sql<{ userId: string; latestMessage: string; latestMessageAt: Date; pendingCount: number; version: number }[]>`
    select user_id as "userId", latest_user_message as "latestMessage",
      latest_user_message_at as "latestMessageAt", pending_count as "pendingCount", version
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
