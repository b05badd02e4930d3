/**
 * Invoice numbers and dates, taken by every invoice: the invoice run's (src/invoices/store.ts) and a
 * config purchase's, issued here in the purchase's own transaction.
 */
import type { Db } from '../db.ts'

/**
 * Payer times: a payer's invoices are listed newest first and paged by `before` (strictly older), so
 * no two of one payer's may share a time, or a page ending inside a run's invoices (dated alike)
 * would hide the rest of them from the next page. Each is dated a millisecond after the payer's
 * newest invoice when that is not already earlier than its time. Every invoice is issued holding the
 * counter's row, which the statement that dates it reads after taking (its snapshot sees every invoice
 * issued before), so this holds for concurrent runs and purchases.
 */
export async function lockInvoiceCounter(tx: Db): Promise<void> {
  await tx`select 1 from invoice_counter for no key update`
}

/** The time of the payer's next invoice issued at `at` (rank 0 of those issued together). */
export function payerTime(sql: Db, at: Date, userId: ReturnType<Db>) {
  return sql`greatest(${at}::timestamptz, (select max(i.issued_at) from invoices i where i.user_id = ${userId}) + interval '1 millisecond')`
}

/** The one-line invoice of a config purchase, issued in the purchase's own transaction. */
export async function issuePurchaseInvoice(
  sql: Db,
  purchase: { purchaseId: string; userId: string; participantId: string; configName: string; priceCents: number; at: Date },
): Promise<string> {
  // An invoice run holds the counter for each of its batches (up to 2.6 s measured: docs/limits.md),
  // longer than a request's lock timeout (DATABASE_LOCK_TIMEOUT_MS, 2 s): this one wait is bounded by
  // the statement timeout instead, as the batch bounds it, so a purchase during a run is not a 503.
  // Each setting goes with a statement, pipelined: no round trip of its own (`execute`: sent before
  // the statement after it, which a query not yet awaited is not).
  await Promise.all([sql`set local lock_timeout = 0`.execute(), lockInvoiceCounter(sql)])
  const [, [invoice]] = await Promise.all([
    sql`set local lock_timeout to default`,
    sql<{ id: string }[]>`
    with counter as (
      update invoice_counter set next_number = next_number + 1 returning next_number - 1 as number
    )
    insert into invoices (number, user_id, participant_id, purchase_id, total_cents, issued_at)
    select number, ${purchase.userId}, ${purchase.participantId}, ${purchase.purchaseId}, ${purchase.priceCents},
      ${payerTime(sql, purchase.at, sql`${purchase.userId}::uuid`)}
    from counter
    returning id
  `,
  ])
  await sql`
    insert into invoice_lines (invoice_id, line_number, kind, description, quantity, unit_price_cents, amount_cents)
    values (${invoice!.id}, 1, 'config_purchase', ${`Config: ${purchase.configName}`}, 1, ${purchase.priceCents}, ${purchase.priceCents})
  `
  await sql`update config_purchases set invoice_id = ${invoice!.id} where id = ${purchase.purchaseId}`
  return invoice!.id
}
