/** Wire schemas of billing plans. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../../http/schema.ts'

const terms = {
  name: t.String({ minLength: 1, maxLength: 100 }),
  description: t.Union([t.String({ maxLength: 1000 }), t.Null()]),
  monthlyPriceCents: Int({ minimum: 0, maximum: 10_000_000 }),
  includedProxyCalls: Int({ minimum: 0, maximum: 10_000_000 }),
  overagePerCallCents: Int({ minimum: 0, maximum: 100_000 }),
}

export const Plan = t.Object({
  id: Uuid,
  participantId: Uuid,
  ...terms,
  active: t.Boolean(),
  createdAt: Timestamp,
  updatedAt: Timestamp,
})
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
  { additionalProperties: false },
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
  { additionalProperties: false, description: 'Any of the creation fields but participantId' },
)
export type UpdatePlan = typeof UpdatePlan.static

export const DeactivatedPlan = t.Object({ id: Uuid, active: t.Literal(false) })
