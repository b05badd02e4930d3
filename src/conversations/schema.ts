/** Wire schemas of conversations: the user's side and the agent's reply. */
import { t } from 'elysia'
import { Timestamp, Uuid } from '../http/schema.ts'

const Text = t.String({ minLength: 1, maxLength: 10_000 })

export const Message = t.Object(
  {
    id: Uuid,
    role: t.Union([t.Literal('user'), t.Literal('agent')]),
    text: t.String(),
    createdAt: Timestamp,
  },
  {
    $id: 'Message',
    description: 'A message of a conversation between a user and an agent',
    examples: [
      {
        id: '6e7f8091-a2b3-4c4d-9e5f-60718293a4b5',
        role: 'user',
        text: 'Summarise this week’s papers on RAG',
        createdAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)

export const PostMessage = t.Object({ text: Text }, { $id: 'PostMessage', description: 'What to say to the agent', additionalProperties: false })

export const PostReply = t.Object(
  { userId: Uuid, text: Text },
  { $id: 'PostReply', description: 'The agent’s answer to a user', additionalProperties: false },
)

export const Reply = t.Object(
  { messageId: Uuid, userId: Uuid, text: t.String(), createdAt: Timestamp },
  { $id: 'Reply', description: 'The stored reply; the conversation is no longer pending' },
)
