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
 * Records a user's message, raising the conversation's version. Its time is after the conversation's
 * last message (by a millisecond at least), whose time may come from another process's clock (a
 * reply's): a conversation's messages never share a time, which paging by time relies on.
 */
export async function insertUserMessage(
  sql: Db,
  message: { id: string; participantId: string; userId: string; text: string; at: Date },
): Promise<UserMessageStored | undefined> {
  // One statement (one round trip): the message takes the time the conversation's upsert gave it.
  // Only to an active agent, its row held (key share) to the end of the turn: a deactivation (which
  // locks it for update) in flight is waited for and then seen; one after waits for the turn.
  const [row] = await sql<UserMessageStored[]>`
    with conversation as (
      insert into conversations (participant_id, user_id, latest_user_message, latest_user_message_at, pending_count, version)
      select id, ${message.userId}, ${message.text}, ${message.at}::timestamptz, 1, 1
      from participants where id = ${message.participantId} and active
      for key share
      on conflict (participant_id, user_id) do update
        set latest_user_message = excluded.latest_user_message,
            latest_user_message_at = greatest(excluded.latest_user_message_at,
              conversations.latest_user_message_at + interval '1 millisecond', conversations.latest_reply_at + interval '1 millisecond'),
            pending_count = conversations.pending_count + 1,
            version = conversations.version + 1
      returning pending_count, version, latest_user_message_at
    ), message as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select ${message.id}, ${message.participantId}, ${message.userId}, 'user', ${message.text}, latest_user_message_at
      from conversation
    )
    select pending_count as "pendingCount", version, latest_user_message_at as "createdAt" from conversation
  `
  return row
}

export interface NewReply {
  id: string
  participantId: string
  userId: string
  text: string
}

/** A conversation's state as a writer found it, with its version. */
export interface ConversationState {
  version: number
  pendingCount: number
  latestMessage: string | null
  latestMessageAt: Date | null
}

/**
 * What became of a reply: stored now (with the conversation's new version, and whether it was
 * waiting for a reply), or stored before under the same id (a repeat: nothing changed, and the
 * conversation stands as `conversation` says).
 */
export type ReplyStored =
  { stored: true; createdAt: Date; version: number; wasPending: boolean } | { stored: false; createdAt: Date; conversation: ConversationState }

/**
 * The statement's part that locks the replies' conversations (`input`) in key order, skipping those
 * locked elsewhere unless `wait`, and only of active agents, each held (key share) to the commit: the
 * reply's key may have been checked before its agent was deactivated (in another process, whose
 * eviction is on its way), and a deactivation (which locks the agent's row for update) in flight is
 * waited for, or skipped and then waited for, and seen.
 */
function lockConversations(sql: Db, wait: boolean) {
  const skip = wait ? sql`` : sql`skip locked`
  return sql`
    select c.participant_id, c.user_id, c.pending_count, c.version, c.latest_user_message,
      c.latest_user_message_at, c.latest_reply_at
    from input i
    join conversations c on c.participant_id = i."participantId" and c.user_id = i."userId"
    join participants p on p.id = c.participant_id and p.active
    order by c.participant_id, c.user_id
    for no key update of c ${skip} for key share of p ${skip}
  `
}

/**
 * The statement's part that tells each user of the reply it stored now (`stored` rows joined to
 * their `input`), in the same transaction: a repeat stores nothing, so it tells nobody again.
 */
function replyEvents(sql: Db, at: Date) {
  return sql`
    insert into outbox (user_id, type, data)
    select i."userId", 'conversation.reply', json_build_object(
      'type', 'conversation.reply', 'createdAt', ${at.toISOString()}::text,
      'participantId', i."participantId", 'messageId', i.id, 'text', i.text)::text
    from stored s join input i on i.id = s.id
    returning 1
  `
}

/**
 * Records agents' replies under new ids (no two to one conversation, and no earlier attempt can have
 * stored them) at `at`, in one statement. Each reply takes its conversation's row first, so the row
 * lock orders it against the user's messages and other replies; it ends the pending state and raises
 * the version, and its time is after the conversation's last message. Unless `wait`, a row locked
 * elsewhere (a turn applying a user's message, say) is skipped rather than waited for: a statement
 * of many replies never waits holding rows, so it cannot close a cycle of waits with a transaction
 * that takes the same rows in another order. Not in the map: a reply skipped, one of an agent
 * deactivated meanwhile, one to a user who never wrote to the agent, or to a user no longer subscribed
 * with no message waiting for it (`whyNotReplied` tells the last three apart).
 */
export async function storeFreshReplies(sql: Db, replies: NewReply[], at: Date, wait: boolean): Promise<Map<string, ReplyStored>> {
  const rows = await sql<{ id: string; createdAt: Date; version: number; wasPending: boolean }[]>`
    with input as (
      select * from json_to_recordset(${JSON.stringify(replies)}::text::json)
        as i(id uuid, "participantId" uuid, "userId" uuid, text text)
    ), locked as (
      ${lockConversations(sql, wait)}
    ), replied as (
      update conversations c
      set pending_count = 0, answered_count = c.pending_count, version = c.version + 1,
        latest_reply_at = greatest(${at}::timestamptz,
          c.latest_user_message_at + interval '1 millisecond', c.latest_reply_at + interval '1 millisecond')
      from input i join locked l on l.participant_id = i."participantId" and l.user_id = i."userId"
      where c.participant_id = l.participant_id and c.user_id = l.user_id
        -- Waiting for a reply (its message was sent while subscribed), or still subscribed.
        and (c.pending_count > 0 or exists (
          select 1 from subscriptions s where s.user_id = c.user_id and s.participant_id = c.participant_id and s.status = 'active'))
      returning c.participant_id, c.user_id, c.version, c.latest_reply_at, c.answered_count
    ), stored as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select i.id, i."participantId", i."userId", 'agent', i.text, r.latest_reply_at
      from input i join replied r on r.participant_id = i."participantId" and r.user_id = i."userId"
      returning id, created_at
    ), announced as (
      ${replyEvents(sql, at)}
    )
    select s.id, s.created_at as "createdAt", r.version, r.answered_count > 0 as "wasPending"
    from input i
    join replied r on r.participant_id = i."participantId" and r.user_id = i."userId"
    join stored s on s.id = i.id
  `
  return new Map(rows.map(({ id, createdAt, version, wasPending }) => [id, { stored: true, createdAt, version, wasPending }]))
}

/**
 * Records replies under ids their senders chose (an Idempotency-Key), which an earlier attempt may
 * have stored (its answer lost), as `storeFreshReplies` does the others (skipping rows locked
 * elsewhere unless `wait`): a message already there (seen by the insert, which waits for whoever is
 * writing it) changes nothing, so a repeat never ends a newer message's pending state. An id already
 * stored for another conversation maps to an error (ids come from the reservation, so it cannot be).
 */
export async function storeChosenReplies(sql: Db, replies: NewReply[], at: Date, wait: boolean): Promise<Map<string, ReplyStored | Error>> {
  type Row = { id: string; createdAt: Date | null; version: number | null; wasPending: boolean } & ConversationState
  const rows = await sql<Row[]>`
    with input as (
      select * from json_to_recordset(${JSON.stringify(replies)}::text::json)
        as i(id uuid, "participantId" uuid, "userId" uuid, text text)
    ), locked as (
      ${lockConversations(sql, wait)}
    ), stored as (
      insert into messages (id, participant_id, user_id, role, text, created_at)
      select i.id, i."participantId", i."userId", 'agent', i.text,
        greatest(${at}::timestamptz, l.latest_user_message_at + interval '1 millisecond', l.latest_reply_at + interval '1 millisecond')
      from input i join locked l on l.participant_id = i."participantId" and l.user_id = i."userId"
      where l.pending_count > 0 or exists (
        select 1 from subscriptions s where s.user_id = l.user_id and s.participant_id = l.participant_id and s.status = 'active')
      on conflict (id) do nothing
      returning id, participant_id, user_id, created_at
    ), announced as (
      ${replyEvents(sql, at)}
    ), replied as (
      update conversations c
      set pending_count = 0, answered_count = c.pending_count, version = c.version + 1, latest_reply_at = s.created_at
      from stored s
      where c.participant_id = s.participant_id and c.user_id = s.user_id
      returning c.participant_id, c.user_id, c.version
    )
    select i.id, s.created_at as "createdAt", coalesce(r.version, l.version) as version, l.pending_count > 0 as "wasPending",
      l.pending_count as "pendingCount", l.latest_user_message as "latestMessage", l.latest_user_message_at as "latestMessageAt"
    from input i
    join locked l on l.participant_id = i."participantId" and l.user_id = i."userId"
    left join stored s on s.id = i.id
    left join replied r on r.participant_id = s.participant_id and r.user_id = s.user_id
  `
  const outcomes = new Map<string, ReplyStored | Error>()
  const repeats = new Map<string, Row>()
  for (const row of rows) {
    if (row.createdAt) outcomes.set(row.id, { stored: true, createdAt: row.createdAt, version: row.version, wasPending: row.wasPending })
    else repeats.set(row.id, row)
  }
  if (repeats.size > 0) {
    // Stored by an earlier attempt, perhaps after this statement began: read its time afresh. Where the
    // conversation stands is what this statement found under its lock.
    const earlier = await sql<{ id: string; createdAt: Date; participantId: string; userId: string }[]>`
      select id, created_at as "createdAt", participant_id as "participantId", user_id as "userId"
      from messages where id = any(${[...repeats.keys()]}::uuid[])
    `
    const byId = new Map(replies.map(reply => [reply.id, reply]))
    for (const message of earlier) {
      const reply = byId.get(message.id)!
      if (message.participantId !== reply.participantId || message.userId !== reply.userId) {
        outcomes.set(message.id, new Error(`reply ${message.id} repeats a message of another conversation`))
        continue
      }
      const { version, pendingCount, latestMessage, latestMessageAt } = repeats.get(message.id)!
      outcomes.set(message.id, {
        stored: false,
        createdAt: message.createdAt,
        conversation: { version, pendingCount, latestMessage, latestMessageAt },
      })
    }
  }
  return outcomes
}

/**
 * A page of the agent's conversations at their versions, the pending ones with their entry, after
 * `afterUserId` in user id order: what its inbox is rebuilt from (rarely), page by page, so an agent
 * with a million conversations is not read into memory at once. Through the primary key (an index
 * of the pending ones would make every change of the pending state a non-HOT update, sql/00013).
 */
export async function agentConversations(
  sql: Db,
  participantId: string,
  page: { afterUserId: string | null; limit: number },
): Promise<ConversationNow[]> {
  // Two whole statements rather than a fragment for the bound: each a range of the primary key in any plan.
  const rows = await (page.afterUserId === null
    ? sql<StateRow[]>`
        select participant_id as "agentId", user_id as "userId", latest_user_message as "latestMessage",
          latest_user_message_at as "latestMessageAt", pending_count as "pendingCount", version
        from conversations where participant_id = ${participantId}
        order by user_id limit ${page.limit}
      `
    : sql<StateRow[]>`
        select participant_id as "agentId", user_id as "userId", latest_user_message as "latestMessage",
          latest_user_message_at as "latestMessageAt", pending_count as "pendingCount", version
        from conversations where participant_id = ${participantId} and user_id > ${page.afterUserId}
        order by user_id limit ${page.limit}
      `)
  return rows.map(nowOf)
}

/**
 * Conversations as Postgres holds them now, by agent and user (those that exist, of active agents),
 * each by its primary key. A deactivated agent's are left out: its inbox was forgotten, and nothing
 * reads it again. Nothing is held: an agent deactivated after this read may have its inbox forgotten
 * before the caller's writes land, which the caller then forgets again (`inboxAfterReply`).
 */
export async function conversationsNow(sql: Db, pairs: { agentId: string; userId: string }[]): Promise<ConversationNow[]> {
  const rows = await sql<StateRow[]>`
    select c.participant_id as "agentId", c.user_id as "userId", c.latest_user_message as "latestMessage",
      c.latest_user_message_at as "latestMessageAt", c.pending_count as "pendingCount", c.version
    from unnest(${pairs.map(p => p.agentId)}::uuid[], ${pairs.map(p => p.userId)}::uuid[]) as p(agent_id, user_id)
    join participants a on a.id = p.agent_id and a.active
    cross join lateral (
      select * from conversations where participant_id = p.agent_id and user_id = p.user_id
    ) as c
  `
  return rows.map(nowOf)
}

/** A conversation at its version: pending (what the inbox shows of it) or not. */
export interface ConversationNow {
  agentId: string
  userId: string
  version: number
  pending: PendingConversation | null
}

type StateRow = { agentId: string; userId: string; latestMessage: string; latestMessageAt: Date; pendingCount: number; version: number }

const nowOf = ({ agentId, userId, version, latestMessage, latestMessageAt, pendingCount }: StateRow): ConversationNow => ({
  agentId,
  userId,
  version,
  pending: pendingCount > 0 ? { userId, latestMessage, latestMessageAt: latestMessageAt.toISOString(), pendingCount } : null,
})

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

/**
 * Why a reply was not stored: the agent was deactivated since its key was checked (401), the user
 * never wrote to the agent (404), or may no longer be written to (403). `arrived`: the conversation
 * is there now and open to a reply, so it was committed after the reply's statement ran (the user's
 * first message, applied at that moment).
 */
export async function whyNotReplied(
  sql: Db,
  participantId: string,
  userId: string,
): Promise<'inactive' | 'not_found' | 'not_subscribed' | 'arrived'> {
  const [row] = await sql<{ active: boolean; conversation: boolean; open: boolean }[]>`
    select p.active, c.user_id is not null as conversation, coalesce(c.pending_count > 0 or exists (
        select 1 from subscriptions s where s.user_id = c.user_id and s.participant_id = c.participant_id and s.status = 'active'
      ), false) as open
    from participants p left join conversations c on c.participant_id = p.id and c.user_id = ${userId}
    where p.id = ${participantId}
  `
  if (!row?.active) return 'inactive'
  if (!row.conversation) return 'not_found'
  return row.open ? 'arrived' : 'not_subscribed'
}
