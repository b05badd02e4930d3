/** Wire schemas of subscriptions. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../../http/schema.ts'
import { terms } from '../plans/schema.ts'

export const Subscription = t.Object(
  {
    id: Uuid,
    planId: Uuid,
    participantId: Uuid,
    participantName: t.String(),
    planName: t.String(),
    status: t.Union([t.Literal('active'), t.Literal('cancelled')]),
    currentPeriodStart: Timestamp,
    currentPeriodEnd: Timestamp,
    usage: t.Object({
      proxyCalls: Int({ description: 'Proxy calls counted in the current period' }),
      includedProxyCalls: Int({ description: 'Included in the current period’s terms' }),
    }),
    createdAt: Timestamp,
    cancelledAt: NullableTimestamp,
  },
  {
    $id: 'Subscription',
    description: 'A user’s subscription to an agent’s plan, with the current period’s usage',
    examples: [
      {
        id: '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d',
        planId: '7d1e2f3a-4b5c-4d6e-8f90-a1b2c3d4e5f6',
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        participantName: 'research-bot',
        planName: 'Pro',
        status: 'active',
        currentPeriodStart: '2026-11-22T10:00:00.000Z',
        currentPeriodEnd: '2026-12-22T10:00:00.000Z',
        usage: { proxyCalls: 120, includedProxyCalls: 1000 },
        createdAt: '2026-11-22T10:00:00.000Z',
        cancelledAt: null,
      },
    ],
  },
)
export type Subscription = typeof Subscription.static

export const CreateSubscription = t.Object(
  {
    planId: Uuid,
    expectedTerms: t.Optional(
      t.Object(
        {
          monthlyPriceCents: terms.monthlyPriceCents,
          includedProxyCalls: terms.includedProxyCalls,
          overagePerCallCents: terms.overagePerCallCents,
        },
        {
          description:
            'The plan’s terms the subscriber agreed to (as the plan shows them); a plan whose terms are now otherwise is 409 price_changed',
          additionalProperties: false,
        },
      ),
    ),
  },
  { $id: 'CreateSubscription', description: 'The plan to subscribe to', additionalProperties: false },
)
