/** Wire schemas of the agent's poll and status. */
import { t } from 'elysia'
import { Int, Int64, Timestamp, Uuid } from '../http/schema.ts'

export const AgentEvents = t.Object(
  {
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
  },
  {
    $id: 'AgentEvents',
    description: 'What waits for the agent: conversations with unanswered messages, and open service requests',
    examples: [
      {
        pendingConversations: [
          {
            userId: '5f2d9c1e-8b4a-4e3f-a1d2-7c6b5a4e3d21',
            latestMessage: 'Summarise this week’s papers on RAG',
            latestMessageAt: '2026-11-22T10:00:00.000Z',
            pendingCount: 1,
          },
        ],
        serviceRequests: [],
      },
    ],
  },
)
export type AgentEvents = typeof AgentEvents.static

export const AgentStatus = t.Object(
  {
    balanceCents: Int64({ description: 'Everything invoiced for the agent’s subscriptions and sales' }),
    activeSubscribers: Int(),
    pendingConversations: Int({ description: 'Conversations waiting for a reply' }),
  },
  { $id: 'AgentStatus', description: 'The agent’s standing' },
)
