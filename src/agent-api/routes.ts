/** /v1/agent/events and /v1/agent/status: the agent's poll (the hottest path) and its standing. */
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'
import { errors } from '../errors.ts'
import { failures, Ok, ok, parseTime, Query } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { findParticipant } from '../participants/store.ts'
import { agentBalanceCents } from '../billing/balance.ts'
import { AgentEvents, AgentStatus } from './schema.ts'

const maxItems = 100

export function agentApiRoutes({ sql, inboxes, clock }: Deps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['agent'] })
    .use(auth)
    .get(
      '/events',
      async ({ agent, query }) => {
        const since = parseTime(query.since, '/since')?.toISOString()
        const inbox = inboxes.peek(agent.participantId) ?? (await inboxes.read(agent.participantId))
        const events: AgentEvents = { pendingConversations: [], serviceRequests: [] }
        for (const c of inbox.conversations) {
          if (events.pendingConversations.length === maxItems) break
          if (!since || c.latestMessageAt > since) events.pendingConversations.push(c)
        }
        // Most polls find no request: the clock is read (and formatted) only when one is there.
        const now = inbox.requests.length > 0 ? clock.now().toISOString() : ''
        for (const r of inbox.requests) {
          if (events.serviceRequests.length === maxItems) break
          if (r.expiresAt > now && (!since || r.createdAt > since)) {
            events.serviceRequests.push({
              requestId: r.requestId,
              fromAgentId: r.fromAgentId,
              fromAgentName: r.fromAgentName,
              serviceTag: r.serviceTag,
              input: r.input,
              createdAt: r.createdAt,
            })
          }
        }
        return ok(events)
      },
      {
        agent: true,
        query: Query({
          since: t.Optional(t.String({ description: 'ISO time: only conversations and requests after it' })),
        }),
        response: { 200: Ok(AgentEvents), ...failures(400, 401, 403, 503) },
        detail: {
          operationId: 'pollAgentEvents',
          summary: 'Conversations waiting for a reply and open service requests, oldest first, at most 100 of each',
        },
      },
    )
    .get(
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
        detail: { operationId: 'agentStatus', summary: 'Balance, active subscribers and pending conversations' },
      },
    )
}
