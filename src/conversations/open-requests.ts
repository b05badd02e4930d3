/** SQL for the open service requests an agent's inbox is rebuilt from (inbox-reader.ts). */
import type { Db } from '../db.ts'
import type { OpenServiceRequest } from './inbox.ts'

/** The agent's unanswered, unexpired requests, oldest first: what its inbox is rebuilt from. */
export async function openRequests(sql: Db, targetAgentId: string, now: Date): Promise<OpenServiceRequest[]> {
  const rows = await sql<(Omit<OpenServiceRequest, 'createdAt' | 'expiresAt'> & { createdAt: Date; expiresAt: Date })[]>`
    select r.id as "requestId", r.from_participant_id as "fromAgentId", p.name as "fromAgentName",
      r.service_tag as "serviceTag", r.input, r.created_at as "createdAt", r.expires_at as "expiresAt"
    from service_requests r join participants p on p.id = r.from_participant_id
    where r.target_participant_id = ${targetAgentId} and r.status = 'pending' and r.expires_at > ${now}
    order by r.created_at, r.id
  `
  return rows.map(row => ({ ...row, createdAt: row.createdAt.toISOString(), expiresAt: row.expiresAt.toISOString() }))
}
