/** The agent actor's service-request commands: a request arriving at its target, and the target's answer. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import { notify, type NotifyDeps } from '../events/notify.ts'
import { participantOwner } from '../participants/store.ts'
import { inboxRepair, putOpenRequest, removeOpenRequest, type OpenServiceRequest } from '../conversations/inbox.ts'
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
  /** The requester's owner, told of the answer. */
  notifyUserId?: string
}

type Requested = OpenServiceRequest & { notifyUserId?: string }

export function serviceRequestCommands(deps: NotifyDeps): ActorKind {
  const repair = inboxRepair(deps)
  return {
    'service.request': {
      async apply(tx, request: NewRequest, { id, at }): Promise<Requested> {
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
        return { ...request, createdAt: at.toISOString(), expiresAt: expiresAt.toISOString(), notifyUserId: await participantOwner(tx, id) }
      },
      async project({ notifyUserId, ...request }: Requested, _payload, { id }) {
        await putOpenRequest(deps, id, request)
        if (notifyUserId) {
          await notify(deps, notifyUserId, 'service.requested', {
            requestId: request.requestId,
            fromAgentId: request.fromAgentId,
            targetAgentId: id,
            serviceTag: request.serviceTag,
          })
        }
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
        return {
          requestId: answer.requestId,
          status: answer.success ? 'completed' : 'failed',
          fromAgentId: request.fromAgentId,
          notifyUserId: await participantOwner(tx, request.fromAgentId),
        }
      },
      async project(answered: Answered, _payload, { id }) {
        await removeOpenRequest(deps, id, answered.requestId)
        if (answered.notifyUserId) {
          await notify(deps, answered.notifyUserId, answered.status === 'completed' ? 'service.completed' : 'service.failed', {
            requestId: answered.requestId,
            fromAgentId: answered.fromAgentId,
            targetAgentId: id,
          })
        }
      },
      repair,
    },
  }
}
