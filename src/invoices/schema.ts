/** Wire schema of invoices. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

export const Invoice = t.Object({
  id: Uuid,
  number: Int({ description: 'Sequential, unique, without gaps' }),
  participantId: Uuid,
  subscriptionId: t.Union([Uuid, t.Null()]),
  periodStart: NullableTimestamp,
  periodEnd: NullableTimestamp,
  lines: t.Array(
    t.Object({
      kind: t.Union([t.Literal('subscription'), t.Literal('overage'), t.Literal('config_purchase')]),
      description: t.String(),
      quantity: Int(),
      unitPriceCents: Int(),
      amountCents: Int(),
    }),
  ),
  totalCents: Int(),
  status: t.Literal('issued'),
  issuedAt: Timestamp,
})
