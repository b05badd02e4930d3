/** The agent actor's service-request commands: a request arriving at its target, and the target's answer. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, putOpenRequest, removeOpenRequest, type InboxDeps, type OpenServiceRequest } from '../conversations/inbox.ts'
import { findServiceRequest, insertServiceRequest, respondToRequest } from './store.ts'

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

export function serviceRequestCommands(deps: InboxDeps): ActorKind {
  const repair = inboxRepair(deps)
  return {
    'service.request': {
      async apply(tx, request: NewRequest, { id, at }): Promise<OpenServiceRequest> {
        const expiresAt = new Date(at.getTime() + requestLifetimeMs)
        await insertServiceRequest(tx, {
          id: request.requestId,
          fromAgentId: request.fromAgentId,
          targetAgentId: id,
          serviceTag: request.serviceTag,
          input: request.input,
          at,
          expiresAt,
        })
        const ownerId = await participantOwner(tx, id)
        if (ownerId) {
          const payload = { requestId: request.requestId, fromAgentId: request.fromAgentId, targetAgentId: id, serviceTag: request.serviceTag }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: 'service.requested', payload }])
        }
        return { ...request, createdAt: at.toISOString(), expiresAt: expiresAt.toISOString() }
      },
      async project(request: OpenServiceRequest, _payload, { id, fence }) {
        await putOpenRequest(deps, id, fence, request)
      },
      repair,
    },
    'service.respond': {
      async apply(tx, answer: Answer, { id, at }): Promise<Answered | Refusal> {
        const request = await findServiceRequest(tx, answer.requestId)
        if (!request || request.targetAgentId !== id) return { refused: 'not_found' }
        if (!(await respondToRequest(tx, { id: answer.requestId, output: answer.output, success: answer.success, at }))) {
          return { refused: request.status === 'pending' || request.status === 'expired' ? 'expired' : 'already_responded' }
        }
        const status = answer.success ? 'completed' : 'failed'
        const ownerId = await participantOwner(tx, request.fromAgentId)
        if (ownerId) {
          const payload = { requestId: answer.requestId, fromAgentId: request.fromAgentId, targetAgentId: id }
          await enqueueEvents(tx, at, [{ userId: ownerId, type: `service.${status}`, payload }])
        }
        return { requestId: answer.requestId, status, fromAgentId: request.fromAgentId }
      },
      async project(answered: Answered, _payload, { id, fence }) {
        await removeOpenRequest(deps, id, fence, answered.requestId)
      },
      repair,
    },
  }
}
