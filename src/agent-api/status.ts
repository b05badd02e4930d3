/** GET /v1/agent/status: the agent's standing. */
import { Elysia } from 'elysia'
import type { Sql } from '../db.ts'
import type { InboxReader } from '../conversations/inbox-reader.ts'
import { errors } from '../errors.ts'
import { failures, Ok, ok } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { findParticipant } from '../participants/store.ts'
import { agentBalanceCents } from '../billing/balance.ts'
import { AgentStatus } from './schema.ts'

export function agentStatusRoutes({ sql, inboxes }: { sql: Sql; inboxes: InboxReader }, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['agent'] }).use(auth).get(
    '/status',
    async ({ agent }) => {
      const [participant, inbox, balanceCents] = await Promise.all([
        findParticipant(sql, agent.participantId),
        inboxes.read(agent.participantId),
        agentBalanceCents(sql, agent.participantId),
      ])
      if (!participant) throw errors.invalidToken()
      return ok({
        balanceCents,
        activeSubscribers: participant.activeSubscribers,
        pendingConversations: inbox.conversations.length,
      })
    },
    {
      agent: true,
      response: { 200: Ok(AgentStatus), ...failures(401, 403, 503) },
      detail: {
        operationId: 'agentStatus',
        summary: 'Balance, active subscribers and pending conversations',
        description:
          'Needs the agent’s key (`X-API-Key` or bearer `sk_agt_`). `balanceCents` is everything invoiced for the agent’s ' +
          'subscriptions and config sales. `pendingConversations` counts every conversation waiting for a reply, not only ' +
          'the 100 a poll returns.',
      },
    },
  )
}
