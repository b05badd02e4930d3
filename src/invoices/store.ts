/** SQL for invoices: set-based issuing of ended periods, and the payer's list. */
import type { Db, Sql } from '../db.ts'
import { lockInvoiceCounter, payerTime } from '../billing/invoice-numbers.ts'

/** Ended, uninvoiced periods as of `at`. */
export async function countDuePeriods(sql: Db, at: Date): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from subscription_periods where invoice_id is null and period_end <= ${at}
  `
  return row!.n
}

/** Where a run's batches have got to in the run's order: the last period a batch took. */
export interface DueCursor {
  periodEnd: Date
  subscriptionId: string
  periodIndex: number
}

/**
 * Issues invoices for up to `limit` ended periods after `after` in one transaction: numbers taken
 * from the counter (locked until commit, so there are no gaps), the monthly line at the period's
 * terms, an overage line when calls went over the included ones, the period marked, and each payer's
 * `invoice.issued` event recorded. Periods ended by `endedBy` are due; the invoices are dated
 * `issuedAt`, each a millisecond after the payer's newest (`payerTime`). Periods another run is
 * issuing right now are skipped, and (subscription, period) is unique, so none is invoiced twice.
 * Returns how many were issued (0: none was due) and the last period taken, for the next batch to
 * start after.
 */
export async function issueDueInvoices(
  sql: Sql,
  when: { endedBy: Date; issuedAt: Date },
  limit: number,
  after?: DueCursor,
): Promise<{ issued: number; last: DueCursor | undefined }> {
  const [row] = await sql.begin(async tx => {
    await lockInvoiceCounter(tx)
    return tx<({ n: number } & DueCursor)[]>`
      with due as (
        ${duePeriods(tx, when.endedBy, limit, after)}
      ),
      numbered as (
        select due.*, uuid_v7() as invoice_id,
          row_number() over (order by period_end, subscription_id, period_index) as n,
          row_number() over (partition by user_id order by period_end, subscription_id, period_index) - 1 as payer_rank,
          -- bigint: calls times a price per call can pass 2^31 cents
          greatest(0, proxy_calls - included_proxy_calls)::bigint as overage_calls
        from due
      ),
      counter as (
        update invoice_counter set next_number = next_number + (select count(*) from numbered)
        returning next_number - (select count(*) from numbered) as first
      ),
      issued as (
        insert into invoices (
          id, number, user_id, participant_id, subscription_id, period_index, period_start, period_end,
          total_cents, issued_at
        )
        select invoice_id, counter.first + n - 1, user_id, participant_id, subscription_id, period_index,
          period_start, period_end, monthly_price_cents + overage_calls * overage_per_call_cents,
          ${payerTime(tx, when.issuedAt, tx`numbered.user_id`)} + payer_rank * interval '1 millisecond'
        from numbered, counter
        returning id, user_id as "userId", number, total_cents as "totalCents"
      ),
      monthly as (
        insert into invoice_lines (invoice_id, line_number, kind, description, quantity, unit_price_cents, amount_cents)
        select invoice_id, 1, 'subscription',
          plan_name || ', ' || to_char(period_start, 'YYYY-MM-DD') || ' to ' || to_char(period_end, 'YYYY-MM-DD'),
          1, monthly_price_cents, monthly_price_cents
        from numbered
        returning 1
      ),
      overage as (
        insert into invoice_lines (invoice_id, line_number, kind, description, quantity, unit_price_cents, amount_cents)
        select invoice_id, 2, 'overage', 'Proxy calls over the ' || included_proxy_calls || ' included',
          overage_calls, overage_per_call_cents, overage_calls * overage_per_call_cents
        from numbered
        where overage_calls > 0
        returning 1
      ),
      marked as (
        update subscription_periods sp set invoice_id = numbered.invoice_id
        from numbered
        where sp.subscription_id = numbered.subscription_id and sp.period_index = numbered.period_index
        returning 1
      ),
      announced as (
        insert into outbox (user_id, type, data)
        select "userId", 'invoice.issued', json_build_object(
          'type', 'invoice.issued', 'createdAt', ${when.issuedAt.toISOString()}::text,
          'invoiceId', id, 'number', number, 'totalCents', "totalCents")::text
        from issued
        order by number
        returning 1
      )
      -- The last period taken: its number in the batch is how many were issued (every one is).
      select n::int, period_end as "periodEnd", subscription_id as "subscriptionId", period_index as "periodIndex"
      from numbered order by n desc limit 1
    `
  })
  if (!row) return { issued: 0, last: undefined }
  const { n, ...last } = row
  return { issued: n, last }
}

/**
 * Up to `limit` ended, uninvoiced periods after `after` with what their invoices need, oldest first,
 * locked (those another run holds are skipped). Read in the order of `subscription_periods_due`
 * (sql/00016) from where the run got to, so a batch costs the same however many periods are due and
 * however many the run has issued (from the start, it would step over each issued period's entry).
 */
export function duePeriods(sql: Db, endedBy: Date, limit: number, after?: DueCursor) {
  const from = after
    ? sql`and (sp.period_end, sp.subscription_id, sp.period_index) > (${after.periodEnd}::timestamptz, ${after.subscriptionId}::uuid, ${after.periodIndex}::int)`
    : sql``
  return sql`
    select sp.subscription_id, sp.period_index, sp.period_start, sp.period_end, sp.monthly_price_cents,
      sp.included_proxy_calls, sp.overage_per_call_cents, sp.proxy_calls, s.user_id, s.participant_id,
      p.name as plan_name
    from subscription_periods sp
    join subscriptions s on s.id = sp.subscription_id
    join plans p on p.id = s.plan_id
    where sp.invoice_id is null and sp.period_end <= ${endedBy} ${from}
    order by sp.period_end, sp.subscription_id, sp.period_index
    limit ${limit}
    for update of sp skip locked
  `
}

export interface InvoiceRow {
  id: string
  number: number
  participantId: string
  subscriptionId: string | null
  periodStart: Date | null
  periodEnd: Date | null
  lines: {
    kind: 'subscription' | 'overage' | 'config_purchase'
    description: string
    quantity: number
    unitPriceCents: number
    amountCents: number
  }[]
  totalCents: number
  status: 'issued'
  issuedAt: Date
}

export async function listInvoices(sql: Db, userId: string, page: { limit: number; before: Date | undefined }): Promise<InvoiceRow[]> {
  return sql<InvoiceRow[]>`
    select i.id, i.number, i.participant_id as "participantId", i.subscription_id as "subscriptionId",
      i.period_start as "periodStart", i.period_end as "periodEnd", i.total_cents as "totalCents", i.status,
      i.issued_at as "issuedAt",
      (
        select json_agg(json_build_object(
          'kind', l.kind, 'description', l.description, 'quantity', l.quantity,
          'unitPriceCents', l.unit_price_cents, 'amountCents', l.amount_cents
        ) order by l.line_number)
        from invoice_lines l where l.invoice_id = i.id
      ) as lines
    from invoices i
    where i.user_id = ${userId} and (${page.before ?? null}::timestamptz is null or i.issued_at < ${page.before ?? null})
    order by i.issued_at desc, i.number desc
    limit ${page.limit}
  `
}
