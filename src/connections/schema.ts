/** Wire schemas of connected accounts. */
import { t } from 'elysia'
import { Timestamp, Uuid } from '../http/schema.ts'

export const Connection = t.Object(
  {
    id: Uuid,
    provider: t.String(),
    baseUrl: t.String(),
    label: t.Union([t.String(), t.Null()]),
    createdAt: Timestamp,
  },
  {
    $id: 'Connection',
    description: 'A connected account (its credential is never shown)',
    examples: [
      {
        id: '8c9d0e1f-2a3b-4c5d-8e6f-7a8b9c0d1e2f',
        provider: 'github',
        baseUrl: 'https://api.github.com',
        label: 'Work account',
        createdAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)

export const CreateConnection = t.Object(
  {
    provider: t.String({ pattern: '^[a-z0-9][a-z0-9_.-]{0,63}$', description: 'e.g. github; one connection per provider' }),
    baseUrl: t.String({ maxLength: 2048, description: 'https (http only for allow-listed hosts); no private addresses' }),
    credential: t.String({
      minLength: 1,
      maxLength: 8192,
      // It becomes a header value: no spaces, line breaks or characters a header cannot carry.
      pattern: '^[\\x21-\\x7e]+$',
      description: 'Printable ASCII with no spaces; sent upstream as Authorization: Bearer; never returned',
    }),
    label: t.Optional(t.String({ maxLength: 100 })),
  },
  { $id: 'CreateConnection', description: 'An account to connect; the credential is stored encrypted', additionalProperties: false },
)

export const DeletedConnection = t.Object(
  { id: Uuid, deleted: t.Literal(true) },
  { $id: 'DeletedConnection', description: 'The connection and its credential are gone' },
)
