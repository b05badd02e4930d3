/** Ended subscription periods with usage for the invoice run, set-based: a million in one transaction of a few statements. */
import type { Sql } from '../../src/db.ts'
import { skipForeignKeyChecks } from './bulk.ts'

const sellers = 10

/**
 * Ten agents with a plan each and payers subscribed to all ten a month and a day before `at`: each
 * subscription has one ended period with proxy calls (some over the included ones). The current
 * periods are left for the invoice run to create, as on the first run after a month turns. `tag`
 * keeps the names of one seeding apart from another's in the same database.
 */
export async function seedEndedPeriods(sql: Sql, periods: number, at: Date, tag: string): Promise<number> {
  const payers = Math.ceil(periods / sellers)
  await sql.begin(async tx => {
    await skipForeignKeyChecks(tx)
    const [owner] = await tx<{ id: string }[]>`insert into users (provider_id) values (${`bench-seller-owner-${tag}`}) returning id`
    await tx`
      insert into participants (owner_id, name, display_name)
      select ${owner!.id}, ${`bench-seller-${tag}-`} || a, 'Bench seller ' || a from generate_series(1, ${sellers}) a
    `
    await tx`
      insert into plans (participant_id, name, monthly_price_cents, included_proxy_calls, overage_per_call_cents, created_at, updated_at)
      select id, 'Pro', 1000 + 100 * row_number() over (order by name), 3, 10, ${at}::timestamptz - interval '1 year', ${at}::timestamptz - interval '1 year'
      from participants where owner_id = ${owner!.id}
    `
    await tx`
      insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
      select p.id, p.created_at, p.monthly_price_cents, p.included_proxy_calls, p.overage_per_call_cents
      from plans p join participants a on a.id = p.participant_id where a.owner_id = ${owner!.id}
    `
    await tx`
      with payers as (
        insert into users (provider_id)
        select ${`bench-payer-${tag}-`} || i from generate_series(1, ${payers}) i
        returning id
      )
      insert into subscriptions (user_id, participant_id, plan_id, status, started_at, created_at)
      select u.id, p.participant_id, p.id, 'active',
        ${at}::timestamptz - interval '1 month' - interval '1 day', ${at}::timestamptz - interval '1 month' - interval '1 day'
      from payers u
      cross join (select p.* from plans p join participants a on a.id = p.participant_id where a.owner_id = ${owner!.id}) p
      limit ${periods}
    `
    await tx`
      insert into subscription_periods (
        subscription_id, period_index, period_start, period_end,
        monthly_price_cents, included_proxy_calls, overage_per_call_cents, proxy_calls
      )
      select s.id, 0, s.started_at, s.started_at + interval '1 month',
        p.monthly_price_cents, p.included_proxy_calls, p.overage_per_call_cents, 1 + abs(hashtext(s.id::text)) % 8
      from subscriptions s join plans p on p.id = s.plan_id
      join participants a on a.id = s.participant_id
      where a.owner_id = ${owner!.id}
    `
  })
  await sql`analyze`
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from subscription_periods where period_end <= ${at} and invoice_id is null and proxy_calls > 0
  `
  return row!.n
}

/** Removes every subscription, period and invoice, so the next seeding's run starts from the same place. */
export async function clearBilling(sql: Sql): Promise<void> {
  await sql`truncate invoice_lines, invoices, subscription_periods, subscriptions, plan_terms, plans cascade`
  await sql`analyze`
}
