/** An agent's balance: what its sales have earned so far. */
import type { Db } from '../db.ts'

/** Config sales recorded at the price paid; subscription invoices join this when invoicing lands. */
export async function agentBalanceCents(sql: Db, participantId: string): Promise<number> {
  const [row] = await sql<{ cents: number }[]>`
    select coalesce(sum(cp.price_cents), 0)::bigint as cents
    from config_purchases cp join config_listings c on c.id = cp.config_id
    where c.participant_id = ${participantId}
  `
  return row!.cents
}
