/** /v1/billing/reviews: one rating and comment per customer and agent, created or updated. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../../db.ts'
import type { Clock } from '../../clock.ts'
import { errors } from '../../errors.ts'
import { requireParticipant } from '../../participants/ownership.ts'
import { BeforeParam, failures, iso, Ok, ok, pageLimit, parseBefore, Query, Uuid } from '../../http/schema.ts'
import type { AuthPlugin } from '../../auth/plugin.ts'
import type { RateLimiter } from '../../rate-limit/token-bucket.ts'
import { hasSubscribed } from '../subscriptions/store.ts'
import { hasBoughtFrom } from '../configs/store.ts'
import { enqueueEvents } from '../../events/outbox.ts'
import { Review, WriteReview } from './schema.ts'
import { findReview, insertReview, listReviews, updateReview, type ReviewRow } from './store.ts'

const listLimit = pageLimit(20, 100)

const reviewView = (row: ReviewRow): Review => ({
  id: row.id,
  participantId: row.participantId,
  userId: row.userId,
  rating: row.rating,
  comment: row.comment,
  createdAt: iso(row.createdAt),
  updatedAt: iso(row.updatedAt),
})

/** What the review routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  rateLimiter: RateLimiter
}

export function reviewRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, clock, rateLimiter } = deps
  return new Elysia({ prefix: '/reviews', tags: ['billing'] })
    .use(auth)
    .post(
      '',
      async ({ user, body, set }) => {
        // Taken before the agent's row is locked: a loop of writes, a customer's or not, holds it no more.
        await rateLimiter.take('reviewWrite', `user:${user.userId}`)
        const { created, row } = await sql.begin(async tx => {
          // The agent's row lock serialises its reviews, so the aggregate never races.
          const participant = await requireParticipant(tx, body.participantId, { lock: true })
          if (participant.ownerId === user.userId) throw errors.cannotReviewOwnAgent()
          const customer = (await hasSubscribed(tx, user.userId, participant.id)) || (await hasBoughtFrom(tx, user.userId, participant.id))
          if (!customer) throw errors.notACustomer()
          const previous = await findReview(tx, participant.id, user.userId)
          // An update without `comment` keeps the comment; an explicit null clears it.
          const change = { rating: body.rating, comment: body.comment === undefined ? (previous?.comment ?? null) : body.comment }
          const at = clock.now()
          const row = previous
            ? await updateReview(tx, previous, change, at)
            : await insertReview(tx, { participantId: participant.id, userId: user.userId, ...change }, at)
          const payload = { reviewId: row.id, participantId: row.participantId, userId: row.userId, rating: row.rating, comment: row.comment }
          await enqueueEvents(tx, at, [{ userId: participant.ownerId, type: previous ? 'review.updated' : 'review.created', payload }])
          return { created: !previous, row }
        })
        set.status = created ? 201 : 200
        return ok(reviewView(row))
      },
      {
        user: true,
        body: WriteReview,
        response: { 200: Ok(Review), 201: Ok(Review), ...failures(400, 401, 403, 404, 429) },
        detail: {
          operationId: 'writeReview',
          summary: 'Review an agent you subscribed to or bought from: 201 created, 200 updated',
          description:
            'Needs a user credential. Only a customer may review: a user who has or had a subscription to the agent, or ' +
            'bought one of its configs (else 403 `not_a_customer`). The owner is 403 `cannot_review_own_agent`. ' +
            'Writing again replaces the rating; without `comment` the old comment stays, `null` clears it. ' +
            'Each write is told to the agent’s owner (`review.created`, `review.updated`). Rate limited per user, refused ' +
            'writes too (rule `reviewWrite`, 30 an hour by default): 429 `rate_limited`.',
        },
      },
    )
    .get(
      '/:participantId',
      async ({ params, query }) => {
        const participant = await requireParticipant(sql, params.participantId)
        const page = { limit: listLimit.parse(query.limit), before: parseBefore(query.before, '/before') }
        return ok((await listReviews(sql, participant.id, page)).map(reviewView))
      },
      {
        caller: true,
        params: t.Object({ participantId: Uuid }),
        query: Query({ limit: listLimit.param, before: BeforeParam }),
        response: { 200: Ok(t.Array(Review)), ...failures(400, 401, 404) },
        detail: {
          operationId: 'listReviews',
          summary: 'An agent’s reviews, newest first (default 20, max 100)',
          description:
            'Any credential: a user’s or an agent’s key. Pages with `limit` and `before`, by when each review was first ' +
            'written (an update keeps its place); no two of an agent’s reviews share a time, so a page never ends among ' +
            'reviews the next would skip. Reviewers are shown by user id only. ' +
            'An unknown or deactivated agent is 404.',
        },
      },
    )
}
