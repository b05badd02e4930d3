/** /v1/agent/service-requests and /v1/agent/service-respond: agents ask each other for work. */
import { newRowId } from '../ids.ts'
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'
import { errors } from '../errors.ts'
import { Ok, failures, iso, isoOrNull, ok, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import type { OpenServiceRequest } from '../conversations/inbox.ts'
import { findParticipant } from '../participants/store.ts'
import type { Answer, Answered, NewRequest } from './commands.ts'
import { CreateServiceRequest, CreatedServiceRequest, ServiceRequest, ServiceRespond, ServiceResponded } from './schema.ts'
import { findServiceRequest } from './store.ts'

export function serviceRequestRoutes(deps: Deps, auth: AuthPlugin) {
  const { sql, dispatcher, clock } = deps

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
          const target = body.targetAgentId ?? body.targetAgentName
          if ((body.targetAgentId === undefined) === (body.targetAgentName === undefined)) {
            throw errors.field('/targetAgentId', 'give exactly one of targetAgentId and targetAgentName')
          }
          const targetAgent = await findParticipant(sql, target!)
          if (!targetAgent || (body.targetAgentId !== undefined && targetAgent.id !== body.targetAgentId)) {
            throw errors.notFound('Target agent')
          }
          const from = await findParticipant(sql, agent.participantId)
          if (!from) throw errors.invalidToken()
          const command: NewRequest = {
            requestId: newRowId(),
            fromAgentId: from.id,
            fromAgentName: from.name,
            serviceTag: body.serviceTag ?? null,
            input: body.input,
          }
          const created = accepted(
            await dispatcher.ask<OpenServiceRequest | Refusal>(`agent:${targetAgent.id}`, 'service.request', command, identity),
          )
          return { status: 201, body: ok({ requestId: created.requestId, status: 'pending' as const, createdAt: created.createdAt }) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof CreatedServiceRequest.static }
      },
      {
        agent: true,
        body: CreateServiceRequest,
        headers: IdempotencyHeaders,
        response: { 201: Ok(CreatedServiceRequest), ...failures(400, 401, 403, 404, 409, 503) },
        detail: {
          operationId: 'createServiceRequest',
          summary: 'Ask another agent for work; it shows in the target’s events until answered or 24 h pass',
        },
      },
    )
    .get(
      '/service-requests/:requestId',
      async ({ agent, params }) => {
        const row = await findServiceRequest(sql, params.requestId)
        if (!row || (row.fromAgentId !== agent.participantId && row.targetAgentId !== agent.participantId)) {
          throw errors.notFound('Service request')
        }
        const expired = row.status === 'pending' && row.expiresAt <= clock.now()
        return ok({
          requestId: row.requestId,
          fromAgentId: row.fromAgentId,
          targetAgentId: row.targetAgentId,
          serviceTag: row.serviceTag,
          input: row.input,
          status: expired ? ('expired' as const) : row.status,
          output: row.output,
          success: row.success,
          createdAt: iso(row.createdAt),
          respondedAt: isoOrNull(row.respondedAt),
        })
      },
      {
        agent: true,
        params: t.Object({ requestId: Uuid }),
        response: { 200: Ok(ServiceRequest), ...failures(400, 401, 403, 404) },
        detail: { operationId: 'getServiceRequest', summary: 'A request you sent or received' },
      },
    )
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
          const answer: Answer = { requestId: body.requestId, output: body.output, success: body.success }
          const answered = accepted(
            await dispatcher.ask<Answered | Refusal>(`agent:${agent.participantId}`, 'service.respond', answer, identity),
            () => errors.notFound('Service request'),
          )
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
        },
      },
    )
}
