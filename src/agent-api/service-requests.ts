/** /v1/agent/service-requests and /v1/agent/service-respond: agents ask each other for work. */
import { Elysia, t } from 'elysia'
import type { Log } from '../log.ts'
import type { RequestDeps } from '../service-requests/requests.ts'
import { Ok, failure, failures, ok, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { answerServiceRequest, readServiceRequest, sendServiceRequest } from '../service-requests/requests.ts'
import { CreateServiceRequest, CreatedServiceRequest, ServiceRequest, ServiceRespond, ServiceResponded } from '../service-requests/schema.ts'

export function serviceRequestRoutes(deps: RequestDeps & { log: Log }, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['agent'] })
    .use(auth)
    .post(
      '/service-requests',
      async ({ agent, body, headers, set }) => {
        const request = {
          subject: principalSubject(agent),
          key: headers['idempotency-key'],
          method: 'POST',
          path: '/v1/agent/service-requests',
          body,
        }
        const outcome = await idempotentCommand(deps, request, async identity => {
          const created = await sendServiceRequest(deps, agent.participantId, body, identity)
          return { status: 201, body: ok({ requestId: created.requestId, status: 'pending' as const, createdAt: created.createdAt }) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof CreatedServiceRequest.static }
      },
      {
        agent: true,
        body: CreateServiceRequest,
        headers: IdempotencyHeaders,
        response: {
          201: Ok(CreatedServiceRequest),
          ...failures(400, 401, 403, 404, 409, 503),
          429: failure(
            'rate_limited: over the sender’s serviceRequestCreate rate; too_many_open_requests: the target holds as many open ' +
              'requests, or bytes of them, as it may (in all, or from this sender: a quarter of each); see Retry-After',
          ),
        },
        detail: {
          operationId: 'createServiceRequest',
          summary: 'Ask another agent for work; it shows in the target’s events until answered or 24 h pass',
          description:
            'Needs the agent’s key; a sender deactivated before the request is delivered is 401 `invalid_token`, nothing sent. ' +
            'Name the target by exactly one of `targetAgentId` and `targetAgentName`; ' +
            'an unknown or deactivated one is 404. The target’s owner gets `service.requested`; ' +
            'yours gets `service.completed` or `service.failed` once it is answered. ' +
            'On 503, retry with the same `Idempotency-Key`: the request is sent once.',
        },
      },
    )
    .get('/service-requests/:requestId', async ({ agent, params }) => ok(await readServiceRequest(deps, agent.participantId, params.requestId)), {
      agent: true,
      params: t.Object({ requestId: Uuid }),
      response: { 200: Ok(ServiceRequest), ...failures(400, 401, 403, 404) },
      detail: {
        operationId: 'getServiceRequest',
        summary: 'A request you sent or received',
        description:
          'Needs the agent’s key. Only the sender and the target may read it; others get 404. ' +
          'A pending request past its 24 h reads as `expired`. `output`, `success` and `respondedAt` are null until it is ' +
          'answered.',
      },
    })
    .post(
      '/service-respond',
      async ({ agent, body, headers, set }) => {
        const request = {
          subject: principalSubject(agent),
          key: headers['idempotency-key'],
          method: 'POST',
          path: '/v1/agent/service-respond',
          body,
        }
        const outcome = await idempotentCommand(deps, request, async identity => {
          const answered = await answerServiceRequest(deps, agent.participantId, body, identity)
          return { status: 200, body: ok({ requestId: answered.requestId, status: answered.status }) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof ServiceResponded.static }
      },
      {
        agent: true,
        body: ServiceRespond,
        headers: IdempotencyHeaders,
        response: { 200: Ok(ServiceResponded), ...failures(400, 401, 403, 404, 409, 503) },
        detail: {
          operationId: 'respondToServiceRequest',
          summary: 'Answer a request sent to you, once (409 already_responded after)',
          description:
            'Needs the agent’s key; a target deactivated before the answer is applied is 401 `invalid_token`, nothing answered. ' +
            'Only the target may answer: for others, and for an expired request, it is 404. ' +
            '`success: false` marks it `failed`, else `completed`; the sender’s owner is told, and it leaves your events. ' +
            'On 503, retry with the same `Idempotency-Key`: the answer is applied once.',
        },
      },
    )
}
