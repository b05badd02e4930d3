/** SQL for reviews and the rating aggregates they keep on the participant. */
import type { Db } from '../../db.ts'

export interface ReviewRow {
  id: string
  participantId: string
  userId: string
  rating: number
  comment: string | null
  createdAt: Date
  updatedAt: Date
}

const columns = (sql: Db) => sql`
  id, participant_id as "participantId", user_id as "userId", rating, comment,
  created_at as "createdAt", updated_at as "updatedAt"
`

export async function findReview(sql: Db, participantId: string, userId: string): Promise<ReviewRow | undefined> {
  const [row] = await sql<ReviewRow[]>`
    select ${columns(sql)} from reviews where participant_id = ${participantId} and user_id = ${userId}
  `
  return row
}

/**
 * Inserts the review and adds it to the agent's aggregate. The caller holds the agent's row, so each
 * review is dated at least a millisecond after the agent's newest: the list, paged by `before`
 * (strictly older), then skips none of reviews written at once.
 */
export async function insertReview(
  sql: Db,
  review: { participantId: string; userId: string; rating: number; comment: string | null },
  at: Date,
): Promise<ReviewRow> {
  const [row] = await sql<ReviewRow[]>`
    with dated as (
      select greatest(
        ${at}::timestamptz,
        (select max(created_at) from reviews where participant_id = ${review.participantId}) + interval '1 millisecond'
      ) as at
    )
    insert into reviews (participant_id, user_id, rating, comment, created_at, updated_at)
    select ${review.participantId}, ${review.userId}, ${review.rating}, ${review.comment}, dated.at, dated.at
    from dated
    returning ${columns(sql)}
  `
  await sql`
    update participants set rating_sum = rating_sum + ${review.rating}, rating_count = rating_count + 1
    where id = ${review.participantId}
  `
  return row!
}

/** Never dated before the review's creation, which may be ahead of `at` (see insertReview). */
export async function updateReview(sql: Db, previous: ReviewRow, change: { rating: number; comment: string | null }, at: Date): Promise<ReviewRow> {
  const [row] = await sql<ReviewRow[]>`
    update reviews set rating = ${change.rating}, comment = ${change.comment}, updated_at = greatest(${at}::timestamptz, created_at)
    where id = ${previous.id}
    returning ${columns(sql)}
  `
  await sql`
    update participants set rating_sum = rating_sum + ${change.rating - previous.rating}
    where id = ${previous.participantId}
  `
  return row!
}

export async function listReviews(sql: Db, participantId: string, page: { limit: number; before: Date | undefined }): Promise<ReviewRow[]> {
  return sql<ReviewRow[]>`
    select ${columns(sql)} from reviews
    where participant_id = ${participantId}
      and (${page.before ?? null}::timestamptz is null or created_at < ${page.before ?? null})
    order by created_at desc, id desc
    limit ${page.limit}
  `
}
