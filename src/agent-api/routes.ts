/**
 * /v1/agent: every route of the agent API (X-API-Key or Bearer sk_agt_), one plugin per concern. The
 * routes are thin; what they do lives in the feature slices they call (conversations, service-requests,
 * context, proxy-calls).
 */
import { Elysia } from 'elysia'
import type { Log } from '../log.ts'
import type { InboxReader } from '../conversations/inbox-reader.ts'
import type { ReplyDeps } from '../conversations/agent-reply.ts'
import type { RequestDeps } from '../service-requests/requests.ts'
import type { EntryDeps } from '../context/entries.ts'
import type { ProxyDeps } from '../proxy-calls/proxy.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { conversationReplyRoutes } from './conversation-reply.ts'
import { agentEventRoutes } from './events.ts'
import { agentStatusRoutes } from './status.ts'
import { serviceRequestRoutes } from './service-requests.ts'
import { agentContextRoutes } from './context.ts'
import { proxyCallRoutes } from './proxy-call.ts'

/** What the agent API's routes use: what the slices they call need, the inboxes, and a log for idempotent commands. */
export interface RouteDeps extends ReplyDeps, RequestDeps, EntryDeps, ProxyDeps {
  inboxes: InboxReader
  log: Log
}

export function agentApiRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia()
    .use(conversationReplyRoutes(deps, auth))
    .use(agentEventRoutes(deps, auth))
    .use(agentStatusRoutes(deps, auth))
    .use(serviceRequestRoutes(deps, auth))
    .use(agentContextRoutes(deps, auth))
    .use(proxyCallRoutes(deps, auth))
}
