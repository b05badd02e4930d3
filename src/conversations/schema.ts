/** Wire schemas of conversations: the user's side and the agent's reply. */
import { t } from 'elysia'
import { Timestamp, Uuid } from '../http/schema.ts'

const Text = t.String({ minLength: 1, maxLength: 10_000 })

export const Message = t.Object({
  id: Uuid,
  role: t.Union([t.Literal('user'), t.Literal('agent')]),
  text: t.String(),
  createdAt: Timestamp,
})

export const PostMessage = t.Object({ text: Text }, { additionalProperties: false })

export const PostReply = t.Object({ userId: Uuid, text: Text }, { additionalProperties: false })

export const Reply = t.Object({ messageId: Uuid, userId: Uuid, text: t.String(), createdAt: Timestamp })
