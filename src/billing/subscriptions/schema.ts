/** Wire schemas of subscriptions. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../../http/schema.ts'

export const Subscription = t.Object({
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
})
export type Subscription = typeof Subscription.static

export const CreateSubscription = t.Object({ planId: Uuid }, { additionalProperties: false })
