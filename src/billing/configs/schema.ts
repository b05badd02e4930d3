/** Wire schemas of config listings and purchases. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../../http/schema.ts'

const fields = {
  name: t.String({ minLength: 1, maxLength: 100 }),
  description: t.Union([t.String({ maxLength: 1000 }), t.Null()]),
  priceCents: Int({ minimum: 0, maximum: 10_000_000 }),
  fileType: t.String({ pattern: '^[A-Za-z0-9._-]{1,64}$', description: 'A file-name-like label', examples: ['.cursorrules'] }),
  content: t.String({ maxLength: 1_000_000, description: 'Delivered to purchasers' }),
  previewSnippet: t.Union([t.String({ maxLength: 500 }), t.Null()]),
}

export const ConfigListing = t.Object(
  {
    id: Uuid,
    participantId: Uuid,
    name: t.String(),
    description: t.Union([t.String(), t.Null()]),
    priceCents: Int(),
    fileType: t.String(),
    previewSnippet: t.Union([t.String(), t.Null()]),
    active: t.Boolean(),
    createdAt: Timestamp,
    updatedAt: Timestamp,
    content: t.Optional(t.String({ description: 'Only for the owner and for buyers' })),
  },
  {
    $id: 'ConfigListing',
    description: 'A config file for sale; `content` only for its owner and buyers',
    examples: [
      {
        id: '2a3b4c5d-6e7f-4809-9a1b-2c3d4e5f6a7b',
        participantId: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        name: 'Strict TypeScript rules',
        description: null,
        priceCents: 500,
        fileType: '.cursorrules',
        previewSnippet: 'Prefer readonly...',
        active: true,
        createdAt: '2026-11-22T10:00:00.000Z',
        updatedAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type ConfigListing = typeof ConfigListing.static

export const CreateConfig = t.Object(
  {
    participantId: Uuid,
    name: fields.name,
    description: t.Optional(fields.description),
    priceCents: fields.priceCents,
    fileType: fields.fileType,
    content: fields.content,
    previewSnippet: t.Optional(fields.previewSnippet),
  },
  { $id: 'CreateConfig', description: 'A config file to list for sale (bodies up to 2 MiB)', additionalProperties: false },
)
export type CreateConfig = typeof CreateConfig.static

export const UpdateConfig = t.Object(
  {
    name: t.Optional(fields.name),
    description: t.Optional(fields.description),
    priceCents: t.Optional(fields.priceCents),
    fileType: t.Optional(fields.fileType),
    content: t.Optional(fields.content),
    previewSnippet: t.Optional(fields.previewSnippet),
  },
  { $id: 'UpdateConfig', description: 'Any of the listing’s fields', additionalProperties: false },
)
export type UpdateConfig = typeof UpdateConfig.static

export const DeactivatedConfig = t.Object(
  { id: Uuid, active: t.Literal(false) },
  { $id: 'DeactivatedConfig', description: 'The listing is off sale; buyers keep it' },
)

// MaybeEmpty, not t.Optional: a purchase may come with no body at all (the interface's "no body").
export const PurchaseRequest = t.MaybeEmpty(
  t.Object(
    {
      expectedPriceCents: t.Optional(
        Int({ minimum: 0, maximum: 10_000_000, description: 'The price the buyer agreed to; a listing priced otherwise now is 409 price_changed' }),
      ),
    },
    { additionalProperties: false },
  ),
)

export const Purchase = t.Object(
  {
    purchaseId: Uuid,
    configId: Uuid,
    priceCents: Int({ description: 'What was paid' }),
    content: t.String(),
    invoiceId: t.Union([Uuid, t.Null()]),
    purchasedAt: Timestamp,
  },
  { $id: 'Purchase', description: 'A bought config, with its content and invoice' },
)
export type Purchase = typeof Purchase.static

export const MyConfig = t.Object(
  {
    purchaseId: Uuid,
    configId: Uuid,
    participantId: Uuid,
    name: t.String(),
    fileType: t.String(),
    priceCents: Int({ description: 'What was paid' }),
    content: t.String({ description: 'The content as it is now' }),
    purchasedAt: Timestamp,
  },
  { $id: 'PurchasedConfig', description: 'A config the caller bought, with its content as it is now' },
)
