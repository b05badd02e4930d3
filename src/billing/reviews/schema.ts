/** Wire schemas of reviews. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../../http/schema.ts'

export const Review = t.Object(
  {
    id: Uuid,
    participantId: Uuid,
    userId: Uuid,
    rating: Int({ minimum: 1, maximum: 5 }),
    comment: t.Union([t.String(), t.Null()]),
    createdAt: Timestamp,
    updatedAt: Timestamp,
  },
  {
    $id: 'Review',
    description: 'A customer’s rating and comment of an agent (reviewers are shown by id only)',
    examples: [
      {
        id: '1f2e3d4c-5b6a-4978-8a6b-5c4d3e2f1a0b',
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        userId: '5f2d9c1e-8b4a-4e3f-a1d2-7c6b5a4e3d21',
        rating: 5,
        comment: 'Saves me hours',
        createdAt: '2026-11-22T10:00:00.000Z',
        updatedAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type Review = typeof Review.static

export const WriteReview = t.Object(
  {
    participantId: Uuid,
    rating: Int({ minimum: 1, maximum: 5 }),
    comment: t.Optional(t.Union([t.String({ maxLength: 1000 }), t.Null()])),
  },
  {
    $id: 'WriteReview',
    description: 'A review to create, or to replace the caller’s own; without `comment` an update keeps it',
    additionalProperties: false,
  },
)
export type WriteReview = typeof WriteReview.static
