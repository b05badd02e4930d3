/** GET /v1/agent/events: the agent's poll (the hottest path), served from its inbox in process memory or Redis. */
import { Elysia } from 'elysia'
import type { Clock } from '../clock.ts'
import type { InboxReader } from '../conversations/inbox-reader.ts'
import { failures, Ok, ok, parseTime, Query, TimeParam } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { pollEvents } from './poll.ts'
import { AgentEvents } from './schema.ts'

export function agentEventRoutes({ inboxes, clock }: { inboxes: InboxReader; clock: Clock }, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['agent'] }).use(auth).get(
    '/events',
    async ({ agent, query }) => {
      const since = parseTime(query.since, '/since')?.toISOString()
      const inbox = inboxes.peek(agent.participantId) ?? (await inboxes.read(agent.participantId))
      return ok(pollEvents(inbox, since, clock))
    },
    {
      agent: true,
      query: Query({
        since: TimeParam('Only conversations and requests after this ISO 8601 time'),
      }),
      response: { 200: Ok(AgentEvents), ...failures(400, 401, 403, 503) },
      detail: {
        operationId: 'pollAgentEvents',
        summary: 'Conversations waiting for a reply and open service requests, oldest first, at most 100 of each',
        description:
          'Needs the agent’s key (`X-API-Key` or bearer `sk_agt_`). Poll every few seconds (the reference loop waits 5 s). ' +
          'A conversation stays here until replied to (POST /v1/agent/conversation-reply), a request until answered (POST ' +
          '/v1/agent/service-respond) or 24 h old. `since` keeps items after it. On 503, poll again after `Retry-After`.',
      },
    },
  )
}
