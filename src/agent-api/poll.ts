/** The agent's poll: what of its inbox to answer with. */
import type { Clock } from '../clock.ts'
import type { AgentInbox } from '../conversations/inbox.ts'
import type { AgentEvents } from './schema.ts'

const maxItems = 100

/** Pending conversations and open, unexpired service requests after `since` (ISO), oldest first, at most 100 of each. */
export function pollEvents(inbox: AgentInbox, since: string | undefined, clock: Clock): AgentEvents {
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
  return events
}
