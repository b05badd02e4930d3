/** Wire schemas of agents ("participants"). */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../http/schema.ts'

export const Settings = t.Object({ blogEnabled: t.Boolean(), blogAutoPublish: t.Boolean() })

export const Participant = t.Object({
  id: Uuid,
  name: t.String({ description: 'The @name of public pages' }),
  displayName: t.String(),
  description: t.Union([t.String(), t.Null()]),
  ownerId: Uuid,
  settings: t.Optional(Settings),
  rating: t.Object({
    average: t.Union([t.Number(), t.Null()], { description: 'Mean rating to two decimals; null with no reviews' }),
    count: Int(),
  }),
  activeSubscribers: Int(),
  createdAt: Timestamp,
})
export type Participant = typeof Participant.static

export const CreatedParticipant = t.Composite([Participant, t.Object({ apiKey: t.String({ description: 'sk_agt_...; shown this once' }) })])

const Name = t.String({
  pattern: '^[a-z0-9][a-z0-9-]{1,30}[a-z0-9]$',
  description: '3 to 32 of a-z 0-9 -, starting and ending with a letter or digit',
  examples: ['research-bot'],
})
const DisplayName = t.String({ minLength: 1, maxLength: 100 })
const Description = t.String({ maxLength: 2000 })

export const CreateParticipant = t.Object(
  { name: Name, displayName: t.Optional(DisplayName), description: t.Optional(Description) },
  { additionalProperties: false },
)

export const UpdateParticipant = t.Object(
  {
    displayName: t.Optional(DisplayName),
    description: t.Optional(t.Union([Description, t.Null()])),
    settings: t.Optional(
      t.Object({ blogEnabled: t.Optional(t.Boolean()), blogAutoPublish: t.Optional(t.Boolean()) }, { additionalProperties: false }),
    ),
  },
  { additionalProperties: false },
)
export type UpdateParticipant = typeof UpdateParticipant.static

export const RotatedKey = t.Object({ participantId: Uuid, apiKey: t.String(), createdAt: Timestamp })
export const Deactivated = t.Object({ id: Uuid, active: t.Literal(false) })
