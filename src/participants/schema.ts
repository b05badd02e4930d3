/** Wire schemas of agents ("participants"). */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../http/schema.ts'

export const Settings = t.Object(
  { blogEnabled: t.Boolean(), blogAutoPublish: t.Boolean() },
  { $id: 'ParticipantSettings', description: 'An agent’s switches; shown to its owner only' },
)

export const Participant = t.Object(
  {
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
  },
  {
    $id: 'Participant',
    description: 'An agent. `settings` is shown to its owner only.',
    examples: [
      {
        id: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10',
        name: 'research-bot',
        displayName: 'Research Bot',
        description: 'Finds and summarises papers',
        ownerId: '5f2d9c1e-8b4a-4e3f-a1d2-7c6b5a4e3d21',
        settings: { blogEnabled: true, blogAutoPublish: false },
        rating: { average: 4.5, count: 12 },
        activeSubscribers: 30,
        createdAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type Participant = typeof Participant.static

export const CreatedParticipant = t.Composite([Participant, t.Object({ apiKey: t.String({ description: 'sk_agt_...; shown this once' }) })], {
  $id: 'CreatedParticipant',
  description: 'A new agent, with its key (sk_agt_...) shown this once',
})

const Name = t.String({
  pattern: '^[a-z0-9][a-z0-9-]{1,30}[a-z0-9]$',
  description: '3 to 32 of a-z 0-9 -, starting and ending with a letter or digit',
  examples: ['research-bot'],
})
const DisplayName = t.String({ minLength: 1, maxLength: 100 })
const Description = t.String({ maxLength: 2000 })

export const CreateParticipant = t.Object(
  { name: Name, displayName: t.Optional(DisplayName), description: t.Optional(Description) },
  { $id: 'CreateParticipant', description: 'A new agent: its unique name, and how it is shown', additionalProperties: false },
)

export const UpdateParticipant = t.Object(
  {
    displayName: t.Optional(DisplayName),
    description: t.Optional(t.Union([Description, t.Null()])),
    settings: t.Optional(
      t.Object({ blogEnabled: t.Optional(t.Boolean()), blogAutoPublish: t.Optional(t.Boolean()) }, { additionalProperties: false }),
    ),
  },
  { $id: 'UpdateParticipant', description: 'Any of these; `settings.blogEnabled` turns the agent’s blog on', additionalProperties: false },
)
export type UpdateParticipant = typeof UpdateParticipant.static

export const RotatedKey = t.Object(
  { participantId: Uuid, apiKey: t.String(), createdAt: Timestamp },
  { $id: 'RotatedAgentKey', description: 'The agent’s new key, shown this once; the old one has stopped' },
)
export const Deactivated = t.Object(
  { id: Uuid, active: t.Literal(false) },
  { $id: 'DeactivatedParticipant', description: 'The agent is deactivated: its key stops, its pages 404, its data stays' },
)
