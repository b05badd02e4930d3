/** The agent actor's service-request commands: a request arriving at its target, and the target's answer. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { holdActiveAgent, participantOwner } from '../participants/store.ts'
import { inboxRepair, putOpenRequest, removeOpenRequest, type InboxDeps, type OpenServiceRequest } from '../conversations/inbox.ts'
import type { ServiceRequestCaps } from '../config.ts'
import { findServiceRequest, insertServiceRequest, openLoad, respondToRequest, type OpenLoad } from './store.ts'

export const requestLifetimeMs = 24 * 3_600_000

export type NewRequest = Omit<OpenServiceRequest, 'createdAt' | 'expiresAt'>

export interface Answer {
  requestId: string
  output: string
  success: boolean
}

export interface Answered {
  requestId: string
  status: 'completed' | 'failed'
  fromAgentId: string
}

/** The refusal of a request that would take its target's open requests, or its sender's share of them, past the caps. */

/**
 * Whether one more request of `bytes` fits under the caps: the target's open requests, and the
 * sender's share of them (a quarter of each cap, so one sender cannot fill a target's inbox alone).
 */
export function fitsUnderCaps(load: OpenLoad, bytes: number, caps: ServiceRequestCaps): boolean {
  const share = { maxOpen: Math.max(1, Math.floor(caps.maxOpen / 4)), maxOpenBytes: Math.floor(caps.maxOpenBytes / 4) }
  return (
    load.count + 1 <= caps.maxOpen &&
    load.bytes + bytes <= caps.maxOpenBytes &&
    load.fromCount + 1 <= share.maxOpen &&
    load.fromBytes + bytes <= share.maxOpenBytes
  )
}

export function serviceRequestCommands(deps: InboxDeps, caps: ServiceRequestCaps): ActorKind {
  const repair = inboxRepair(deps)
  return {
    'service.request': {
      async apply(tx, request: NewRequest, { id, at }): Promise<OpenServiceRequest | Refusal> {
        // The actor applies this agent's commands one at a time, so the count cannot change under us.
        // Statements that need no answer of each other go together on the turn's connection: two
        // round trips, not five, while the turn holds its rows.
        const [load, target, sender] = await Promise.all([
          openLoad(tx, id, request.fromAgentId, at),
          holdActiveAgent(tx, id),
          holdActiveAgent(tx, request.fromAgentId),
        ])
        // The sender deactivated since its key was checked: the key went with it.
        if (!sender) return { refused: 'invalid_token' }
        // Deactivated since the route found it (the request waited in the mailbox): its inbox is forgotten.
        if (!target) return { refused: 'not_found' }
        if (!fitsUnderCaps(load, Buffer.byteLength(JSON.stringify(request.input)), caps)) return { refused: 'too_many_open_requests' }
        const expiresAt = new Date(at.getTime() + requestLifetimeMs)
        const payload = { requestId: request.requestId, fromAgentId: request.fromAgentId, targetAgentId: id, serviceTag: request.serviceTag }
        await Promise.all([
          insertServiceRequest(tx, {
            id: request.requestId,
            fromAgentId: request.fromAgentId,
            targetAgentId: id,
            serviceTag: request.serviceTag,
            input: request.input,
            at,
            expiresAt,
          }),
          enqueueEvents(tx, at, [{ userId: target.ownerId, type: 'service.requested', payload }]),
        ])
        return { ...request, createdAt: at.toISOString(), expiresAt: expiresAt.toISOString() }
      },
      async project(request: OpenServiceRequest, _payload, { id }) {
        await putOpenRequest(deps, id, request)
      },
      repair,
    },
    'service.respond': {
      async apply(tx, answer: Answer, { id, at }): Promise<Answered | Refusal> {
        const [request, target] = await Promise.all([findServiceRequest(tx, answer.requestId), holdActiveAgent(tx, id)])
        // Deactivated since its key was checked (the answer waited in the mailbox): the key went with it.
        if (!target) return { refused: 'invalid_token' }
        if (!request || request.targetAgentId !== id) return { refused: 'not_found' }
        // Sent together on the turn's connection: one round trip, not two.
        const [responded, ownerId] = await Promise.all([
          respondToRequest(tx, { id: answer.requestId, output: answer.output, success: answer.success, at }),
          participantOwner(tx, request.fromAgentId),
        ])
        if (!responded) {
          return { refused: request.status === 'pending' || request.status === 'expired' ? 'expired' : 'already_responded' }
        }
        const status = answer.success ? 'completed' : 'failed'
        if (ownerId) {
          const payload = { requestId: answer.requestId, fromAgentId: request.fromAgentId, targetAgentId: id }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: `service.${status}`, payload }])
        }
        return { requestId: answer.requestId, status, fromAgentId: request.fromAgentId }
      },
      async project(answered: Answered, _payload, { id }) {
        await removeOpenRequest(deps, id, answered.requestId)
      },
      repair,
    },
  }
}
