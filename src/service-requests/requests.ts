/** Agents asking each other for work: sending a request to its target's actor, reading one, answering one. */
import { newRowId } from '../ids.ts'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { Dispatcher } from '../actors/dispatcher.ts'
import { errors, inOrder } from '../errors.ts'
import { iso, isoOrNull } from '../http/schema.ts'
import type { CommandIdentity } from '../idempotency/idempotent.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import type { OpenServiceRequest } from '../conversations/inbox.ts'
import { findParticipant } from '../participants/store.ts'
import type { Answer, Answered, NewRequest } from './commands.ts'
import type { CreateServiceRequest, ServiceRequest, ServiceRespond } from './schema.ts'
import { findServiceRequest } from './store.ts'

/** What sending, reading and answering service requests use. */
export interface RequestDeps {
  sql: Sql
  clock: Clock
  rateLimiter: RateLimiter
  dispatcher: Dispatcher
}

/**
 * Sends a request from `fromAgentId` to the agent the body names (by id or by name, exactly one),
 * within the sender's `serviceRequestCreate` rate and the target's caps on open requests (429).
 */
export async function sendServiceRequest(
  { sql, dispatcher, rateLimiter }: RequestDeps,
  fromAgentId: string,
  body: typeof CreateServiceRequest.static,
  identity: CommandIdentity,
): Promise<OpenServiceRequest> {
  // The rate first, alone: a caller past it costs Redis one call and PostgreSQL nothing.
  await rateLimiter.take('serviceRequestCreate', `agent:${fromAgentId}`)
  const target = body.targetAgentId ?? body.targetAgentName
  if ((body.targetAgentId === undefined) === (body.targetAgentName === undefined)) {
    throw errors.field('/targetAgentId', 'give exactly one of targetAgentId and targetAgentName')
  }
  const [targetAgent, from] = await inOrder([findParticipant(sql, target!), findParticipant(sql, fromAgentId)] as const)
  if (!targetAgent || (body.targetAgentId !== undefined && targetAgent.id !== body.targetAgentId)) {
    throw errors.notFound('Target agent')
  }
  if (!from) throw errors.invalidToken()
  const command: NewRequest = {
    requestId: newRowId(),
    fromAgentId: from.id,
    fromAgentName: from.name,
    serviceTag: body.serviceTag ?? null,
    input: body.input,
  }
  return accepted(await dispatcher.ask<OpenServiceRequest | Refusal>(`agent:${targetAgent.id}`, 'service.request', command, identity), () =>
    errors.notFound('Target agent'),
  )
}

/** A request `agentId` sent or received (a pending one past its time reads as expired); 404 otherwise. */
export async function readServiceRequest({ sql, clock }: RequestDeps, agentId: string, requestId: string): Promise<typeof ServiceRequest.static> {
  const row = await findServiceRequest(sql, requestId)
  if (!row || (row.fromAgentId !== agentId && row.targetAgentId !== agentId)) {
    throw errors.notFound('Service request')
  }
  const expired = row.status === 'pending' && row.expiresAt <= clock.now()
  return {
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
  }
}

/** Answers a request sent to `agentId`, once, through its actor. */
export async function answerServiceRequest(
  { dispatcher }: RequestDeps,
  agentId: string,
  body: typeof ServiceRespond.static,
  identity: CommandIdentity,
): Promise<Answered> {
  const answer: Answer = { requestId: body.requestId, output: body.output, success: body.success }
  return accepted(await dispatcher.ask<Answered | Refusal>(`agent:${agentId}`, 'service.respond', answer, identity), () =>
    errors.notFound('Service request'),
  )
}
