/** Ownership rules for agents, shared by every slice that lets an owner change something. */
import type { Db } from '../db.ts'
import { errors } from '../errors.ts'
import { findParticipant, lockParticipant, type ParticipantRow } from './store.ts'

/** The active agent with this id (by id only, not by name): 404 when there is none. */
export async function requireParticipant(sql: Db, participantId: string, options: { lock?: boolean } = {}): Promise<ParticipantRow> {
  const participant = options.lock ? await lockParticipant(sql, participantId) : await findParticipant(sql, participantId)
  if (!participant || participant.id !== participantId) throw errors.notFound('Participant')
  return participant
}

/** The active agent with this id if the user owns it: 404 when there is none, 403 when not theirs. */
export async function requireOwnedParticipant(
  sql: Db,
  participantId: string,
  userId: string,
  options: { lock?: boolean } = {},
): Promise<ParticipantRow> {
  const participant = await requireParticipant(sql, participantId, options)
  if (participant.ownerId !== userId) throw errors.forbidden('You do not own this agent')
  return participant
}
