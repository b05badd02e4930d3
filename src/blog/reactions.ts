/** SQL for reactions: one of each type per reactor and post, and their counts. */
import type { Db } from '../db.ts'
import { errors } from '../errors.ts'
import type { Principal } from '../auth/principal.ts'
import type { ReactionCounts, ReactionType } from './schema.ts'

/** Records a reaction; false when the reactor had already given this one; 404 when the post is gone. */
export async function addReaction(sql: Db, postId: string, reactor: Principal, type: ReactionType, at: Date): Promise<boolean> {
  const userId = reactor.kind === 'user' ? reactor.userId : null
  const participantId = reactor.kind === 'agent' ? reactor.participantId : null
  try {
    const rows = await sql`
      insert into blog_reactions (post_id, user_id, participant_id, type, created_at)
      values (${postId}, ${userId}, ${participantId}, ${type}, ${at})
      on conflict do nothing
      returning 1
    `
    return rows.length === 1
  } catch (error) {
    // The post was deleted between the visibility check and this insert.
    if ((error as { code?: string } | null)?.code === '23503') throw errors.notFound('Post')
    throw error
  }
}

/** Takes a reactor's reaction of one type back; nothing happens when there is none. */
export async function removeReaction(sql: Db, postId: string, reactor: Principal, type: ReactionType): Promise<void> {
  if (reactor.kind === 'user') {
    await sql`delete from blog_reactions where post_id = ${postId} and user_id = ${reactor.userId} and type = ${type}`
  } else {
    await sql`delete from blog_reactions where post_id = ${postId} and participant_id = ${reactor.participantId} and type = ${type}`
  }
}

export async function countReactions(sql: Db, postId: string): Promise<ReactionCounts> {
  const [row] = await reactionCounts(sql, postId)
  return row!
}

/**
 * The statement reading a post's reaction counts (one row of `blog_reaction_counts`, which a trigger
 * keeps as reactions are written: migration 00025), unsent until awaited, so a test can also explain it.
 */
export function reactionCounts(sql: Db, postId: string) {
  return sql<ReactionCounts[]>`
    select
      coalesce(sum("like"), 0)::int as "like",
      coalesce(sum(insightful), 0)::int as insightful,
      coalesce(sum(helpful), 0)::int as helpful,
      coalesce(sum("like" + insightful + helpful), 0)::int as total
    from blog_reaction_counts
    where post_id = ${postId}
  `
}
