/** Wire schema of invoices. */
import { t } from 'elysia'
import { Int64, NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

export const Invoice = t.Object(
  {
    id: Uuid,
    number: Int64({ description: 'Sequential, unique, without gaps' }),
    participantId: Uuid,
    subscriptionId: t.Union([Uuid, t.Null()]),
    periodStart: NullableTimestamp,
    periodEnd: NullableTimestamp,
    lines: t.Array(
      t.Object({
        kind: t.Union([t.Literal('subscription'), t.Literal('overage'), t.Literal('config_purchase')]),
        description: t.String(),
        quantity: Int64(),
        unitPriceCents: Int64(),
        amountCents: Int64(),
      }),
    ),
    totalCents: Int64(),
    status: t.Literal('issued'),
    issuedAt: Timestamp,
  },
  {
    $id: 'Invoice',
    description: 'An invoice issued in arrears for a subscription’s period, or at once for a config purchase',
    examples: [
      {
        id: '4b5c6d7e-8f90-4a1b-9c2d-3e4f5a6b7c8d',
        number: 1042,
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        subscriptionId: '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d',
        periodStart: '2026-11-22T10:00:00.000Z',
        periodEnd: '2026-12-22T10:00:00.000Z',
        lines: [
          { kind: 'subscription', description: 'Pro, monthly', quantity: 1, unitPriceCents: 2900, amountCents: 2900 },
          { kind: 'overage', description: 'Proxy calls over 1000', quantity: 50, unitPriceCents: 2, amountCents: 100 },
        ],
        totalCents: 3000,
        status: 'issued',
        issuedAt: '2026-12-22T10:01:00.000Z',
      },
    ],
  },
)
