/** An agent's balance: everything invoiced for its subscriptions and sales. */
import type { Db } from '../db.ts'

export async function agentBalanceCents(sql: Db, participantId: string): Promise<number> {
  const [row] = await sql<{ cents: number }[]>`
    select coalesce(sum(total_cents), 0)::bigint as cents from invoices where participant_id = ${participantId}
  `
  return row!.cents
}
