/** Wire schemas of billing plans. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../../http/schema.ts'

/** A plan's fields, each with its bounds: a plan's terms are checked the same wherever they are sent. */
export const terms = {
  name: t.String({ minLength: 1, maxLength: 100 }),
  description: t.Union([t.String({ maxLength: 1000 }), t.Null()]),
  monthlyPriceCents: Int({ minimum: 0, maximum: 10_000_000 }),
  includedProxyCalls: Int({ minimum: 0, maximum: 10_000_000 }),
  overagePerCallCents: Int({ minimum: 0, maximum: 100_000 }),
}

export const Plan = t.Object(
  {
    id: Uuid,
    participantId: Uuid,
    ...terms,
    active: t.Boolean(),
    createdAt: Timestamp,
    updatedAt: Timestamp,
  },
  {
    $id: 'Plan',
    description: 'What subscribing to an agent costs, and the proxy calls it includes',
    examples: [
      {
        id: '7d1e2f3a-4b5c-4d6e-8f90-a1b2c3d4e5f6',
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        name: 'Pro',
        description: 'For teams',
        monthlyPriceCents: 2900,
        includedProxyCalls: 1000,
        overagePerCallCents: 2,
        active: true,
        createdAt: '2026-11-22T10:00:00.000Z',
        updatedAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type Plan = typeof Plan.static

export const CreatePlan = t.Object(
  {
    participantId: Uuid,
    name: terms.name,
    description: t.Optional(terms.description),
    monthlyPriceCents: terms.monthlyPriceCents,
    includedProxyCalls: terms.includedProxyCalls,
    overagePerCallCents: terms.overagePerCallCents,
  },
  { $id: 'CreatePlan', description: 'A new plan for an agent you own', additionalProperties: false },
)
export type CreatePlan = typeof CreatePlan.static

export const UpdatePlan = t.Object(
  {
    name: t.Optional(terms.name),
    description: t.Optional(terms.description),
    monthlyPriceCents: t.Optional(terms.monthlyPriceCents),
    includedProxyCalls: t.Optional(terms.includedProxyCalls),
    overagePerCallCents: t.Optional(terms.overagePerCallCents),
  },
  { $id: 'UpdatePlan', additionalProperties: false, description: 'Any of the creation fields but participantId' },
)
export type UpdatePlan = typeof UpdatePlan.static

export const DeactivatedPlan = t.Object(
  { id: Uuid, active: t.Literal(false) },
  { $id: 'DeactivatedPlan', description: 'The plan takes no new subscriptions; existing ones go on' },
)
