/** Wire schemas of reviews. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../../http/schema.ts'

export const Review = t.Object({
  id: Uuid,
  participantId: Uuid,
  userId: Uuid,
  rating: Int({ minimum: 1, maximum: 5 }),
  comment: t.Union([t.String(), t.Null()]),
  createdAt: Timestamp,
  updatedAt: Timestamp,
})
export type Review = typeof Review.static

export const WriteReview = t.Object(
  {
    participantId: Uuid,
    rating: Int({ minimum: 1, maximum: 5 }),
    comment: t.Optional(t.Union([t.String({ maxLength: 1000 }), t.Null()])),
  },
  { additionalProperties: false },
)
export type WriteReview = typeof WriteReview.static
