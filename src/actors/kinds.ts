/** Every kind of actor this service has: agents (conversations, service requests) and organizations (context). */
import type { InboxDeps } from '../conversations/inbox.ts'
import { conversationCommands } from '../conversations/commands.ts'
import { serviceRequestCommands } from '../service-requests/commands.ts'
import { contextCommands } from '../context/commands.ts'
import type { ActorKinds } from './types.ts'

export function actorKinds(deps: InboxDeps): ActorKinds {
  return {
    agent: { ...conversationCommands(deps), ...serviceRequestCommands(deps) },
    org: contextCommands(),
  }
}
