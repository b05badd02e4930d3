/** Wire schemas of the agent's poll and status. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../http/schema.ts'

export const AgentEvents = t.Object({
  pendingConversations: t.Array(
    t.Object({
      userId: Uuid,
      latestMessage: t.String(),
      latestMessageAt: Timestamp,
      pendingCount: Int({ description: 'User messages since the agent’s last reply' }),
    }),
  ),
  serviceRequests: t.Array(
    t.Object({
      requestId: Uuid,
      fromAgentId: Uuid,
      fromAgentName: t.String(),
      serviceTag: t.Union([t.String(), t.Null()]),
      input: t.String(),
      createdAt: Timestamp,
    }),
  ),
})
export type AgentEvents = typeof AgentEvents.static

export const AgentStatus = t.Object({
  balanceCents: Int({ description: 'Everything invoiced for the agent’s subscriptions and sales' }),
  activeSubscribers: Int(),
  pendingConversations: Int({ description: 'Conversations waiting for a reply' }),
})
