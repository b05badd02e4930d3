/** SQL for agent-to-agent service requests. */
import type { Db } from '../db.ts'

export type RequestStatus = 'pending' | 'completed' | 'failed' | 'expired'

export interface ServiceRequestRow {
  requestId: string
  fromAgentId: string
  targetAgentId: string
  serviceTag: string | null
  input: string
  status: RequestStatus
  output: string | null
  success: boolean | null
  createdAt: Date
  expiresAt: Date
  respondedAt: Date | null
}

export async function insertServiceRequest(
  sql: Db,
  request: { id: string; fromAgentId: string; targetAgentId: string; serviceTag: string | null; input: string; at: Date; expiresAt: Date },
): Promise<void> {
  await sql`
    insert into service_requests (id, from_participant_id, target_participant_id, service_tag, input, created_at, expires_at)
    values (${request.id}, ${request.fromAgentId}, ${request.targetAgentId}, ${request.serviceTag}, ${request.input}, ${request.at}, ${request.expiresAt})
  `
}

export async function findServiceRequest(sql: Db, id: string): Promise<ServiceRequestRow | undefined> {
  const [row] = await sql<ServiceRequestRow[]>`
    select id as "requestId", from_participant_id as "fromAgentId", target_participant_id as "targetAgentId",
      service_tag as "serviceTag", input, status, output, success, created_at as "createdAt",
      expires_at as "expiresAt", responded_at as "respondedAt"
    from service_requests
    where id = ${id}
  `
  return row
}

export interface OpenLoad {
  /** Open requests addressed to the target, and the bytes of their inputs as JSON strings. */
  count: number
  bytes: number
  /** Those of them from one sender. */
  fromCount: number
  fromBytes: number
}

/**
 * What the open (pending, unexpired) requests addressed to `targetAgentId` add up to, all of them and
 * those from `fromAgentId`. Inputs are measured as the inbox in Redis holds them: JSON strings, UTF-8.
 */
export async function openLoad(sql: Db, targetAgentId: string, fromAgentId: string, now: Date): Promise<OpenLoad> {
  const [row] = await sql<OpenLoad[]>`
    select count(*)::int as count,
      coalesce(sum(octet_length(to_json(input)::text)), 0)::bigint as bytes,
      count(*) filter (where from_participant_id = ${fromAgentId})::int as "fromCount",
      coalesce(sum(octet_length(to_json(input)::text)) filter (where from_participant_id = ${fromAgentId}), 0)::bigint as "fromBytes"
    from service_requests
    where target_participant_id = ${targetAgentId} and status = 'pending' and expires_at > ${now}
  `
  return row!
}

/** Answers a pending, unexpired request; false when it was answered or expired before. */
export async function respondToRequest(sql: Db, answer: { id: string; output: string; success: boolean; at: Date }): Promise<boolean> {
  const rows = await sql`
    update service_requests
    set status = ${answer.success ? 'completed' : 'failed'}, output = ${answer.output},
        success = ${answer.success}, responded_at = ${answer.at}
    where id = ${answer.id} and status = 'pending' and expires_at > ${answer.at}
    returning 1
  `
  return rows.length === 1
}

/** Marks requests past their 24 h expired; returns them so their inboxes can drop them. */
export async function expireRequests(sql: Db, now: Date): Promise<{ requestId: string; targetAgentId: string }[]> {
  return sql<{ requestId: string; targetAgentId: string }[]>`
    update service_requests set status = 'expired'
    where status = 'pending' and expires_at <= ${now}
    returning id as "requestId", target_participant_id as "targetAgentId"
  `
}
