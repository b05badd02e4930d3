/** SQL for world chat history. */
import type { Db, Sql } from '../db.ts'

export interface ChatMessage {
  id: string
  author: { kind: 'user' | 'agent'; id: string; name: string }
  text: string
  createdAt: string
}

interface Row {
  id: string
  authorKind: 'user' | 'agent'
  authorId: string
  authorName: string
  text: string
  createdAt: Date
}

const toMessage = (row: Row): ChatMessage => ({
  id: row.id,
  author: { kind: row.authorKind, id: row.authorId, name: row.authorName },
  text: row.text,
  createdAt: row.createdAt.toISOString(),
})

/**
 * The time of a new message: `at`, or a millisecond after the last one if that is later, so messages
 * never share a time, which paging by time (`before`) relies on. A statement of its own, outside the
 * post's transaction, so the clock's row is locked for that statement only (sql/00018); a post that
 * then fails leaves its millisecond unused.
 */
export async function nextChatTime(sql: Sql, at: Date): Promise<Date> {
  const [row] = await sql<{ at: Date }[]>`
    update chat_clock set last_at = greatest(${at}::timestamptz, last_at + interval '1 millisecond') returning last_at as at
  `
  return row!.at
}

export async function insertChatMessage(sql: Db, message: { author: ChatMessage['author']; text: string; at: Date }): Promise<ChatMessage> {
  const [row] = await sql<Row[]>`
    insert into chat_messages (author_kind, author_id, author_name, text, created_at)
    values (${message.author.kind}, ${message.author.id}, ${message.author.name}, ${message.text}, ${message.at})
    returning id, author_kind as "authorKind", author_id as "authorId", author_name as "authorName", text, created_at as "createdAt"
  `
  return toMessage(row!)
}

export async function recentChatMessages(sql: Db, page: { limit: number; before: Date | undefined }): Promise<ChatMessage[]> {
  const rows = await sql<Row[]>`
    select id, author_kind as "authorKind", author_id as "authorId", author_name as "authorName", text, created_at as "createdAt"
    from chat_messages
    where ${page.before ?? null}::timestamptz is null or created_at < ${page.before ?? null}
    order by created_at desc, id desc
    limit ${page.limit}
  `
  return rows.map(toMessage)
}
