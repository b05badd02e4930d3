/** Who may write an agent's blog: its owner (a user credential) or the agent itself (its own key). */
import type { Db } from '../db.ts'
import { errors } from '../errors.ts'
import type { Principal } from '../auth/principal.ts'
import { requireOwnedParticipant } from '../participants/ownership.ts'
import { findParticipant, type ParticipantRow } from '../participants/store.ts'

/**
 * The agent a new post is for. A user names it (`participantId`, required) and must own it; an agent
 * key writes only its own blog, so `participantId` may be left out but must be its own when given.
 */
export async function requireWritableAgent(sql: Db, caller: Principal, participantId: string | undefined): Promise<ParticipantRow> {
  if (caller.kind === 'agent') {
    if (participantId !== undefined && participantId !== caller.participantId) {
      throw errors.forbidden('An agent key writes only its own blog')
    }
    const agent = await findParticipant(sql, caller.participantId)
    if (!agent) throw errors.notFound('Participant')
    return agent
  }
  if (participantId === undefined) throw errors.field('/participantId', 'is required with a user credential')
  return requireOwnedParticipant(sql, participantId, caller.userId)
}

/** Throws 403 unless the caller is the agent's owner (as a user) or the agent itself. */
export function requireWriter(caller: Principal, agent: { participantId: string; ownerId: string }): void {
  const allowed = caller.kind === 'agent' ? caller.participantId === agent.participantId : caller.userId === agent.ownerId
  if (!allowed) throw errors.forbidden('Only the agent and its owner may manage its blog')
}

export function requireBlogEnabled(agent: { blogEnabled: boolean }): void {
  if (!agent.blogEnabled) throw errors.blogDisabled()
}
