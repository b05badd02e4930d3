/** SQL for billing plans. */
import type { Db } from '../../db.ts'
import type { CreatePlan, UpdatePlan } from './schema.ts'
import { sameTerms, type PlanTerms } from './price-change.ts'

export interface PlanRow {
  id: string
  participantId: string
  ownerId: string
  name: string
  description: string | null
  monthlyPriceCents: number
  includedProxyCalls: number
  overagePerCallCents: number
  active: boolean
  createdAt: Date
  updatedAt: Date
}

const columns = (sql: Db) => sql`
  p.id, p.participant_id as "participantId", a.owner_id as "ownerId", p.name, p.description,
  p.monthly_price_cents as "monthlyPriceCents", p.included_proxy_calls as "includedProxyCalls",
  p.overage_per_call_cents as "overagePerCallCents", p.active,
  p.created_at as "createdAt", p.updated_at as "updatedAt"
`

/**
 * Inserts a plan, with its first terms, for an agent still active: undefined (nothing written) when
 * it is not. The agent's row is held (key share) by the insert itself: a deactivation in flight
 * (which locks it for update) is waited for and then seen; one begun after waits for the plan.
 * Run it in a transaction: the terms are a second statement.
 */
export async function insertPlan(sql: Db, plan: CreatePlan, at: Date): Promise<string | undefined> {
  const [row] = await sql<{ id: string }[]>`
    insert into plans (
      participant_id, name, description, monthly_price_cents, included_proxy_calls,
      overage_per_call_cents, created_at, updated_at
    )
    select
      a.id, ${plan.name}, ${plan.description ?? null}, ${plan.monthlyPriceCents},
      ${plan.includedProxyCalls}, ${plan.overagePerCallCents}, ${at}, ${at}
    from participants a where a.id = ${plan.participantId} and a.active
    for key share
    returning id
  `
  if (row) await recordTerms(sql, row.id, at)
  return row?.id
}

/** Appends the plan's current terms to its history, in force from `at`. */
async function recordTerms(sql: Db, planId: string, at: Date): Promise<void> {
  await sql`
    insert into plan_terms (plan_id, effective_from, monthly_price_cents, included_proxy_calls, overage_per_call_cents)
    select id, ${at}, monthly_price_cents, included_proxy_calls, overage_per_call_cents from plans where id = ${planId}
    on conflict (plan_id, effective_from) do update
      set monthly_price_cents = excluded.monthly_price_cents,
          included_proxy_calls = excluded.included_proxy_calls,
          overage_per_call_cents = excluded.overage_per_call_cents
  `
}

/**
 * A plan of an active agent, with the agent's owner. With `lockAgent` (subscribing), the agent's row is locked as its
 * subscriber count is about to change: a deactivation under way is waited for, and then no plan of
 * it is found. The plan's row is share locked too, so that a subscription and a change of the plan
 * follow one another: a subscription begun while a change of its terms (lockPlan) is being made
 * starts after it, at its terms, and one made while a subscription is being made is dated after it,
 * and announced to it; a subscription begun while the plan is being taken off sale finds it
 * inactive, and a deactivation waits for the subscriptions under way.
 */
export async function findPlan(sql: Db, id: string, options: { lockAgent?: boolean } = {}): Promise<PlanRow | undefined> {
  const [row] = await sql<PlanRow[]>`
    select ${columns(sql)}
    from plans p join participants a on a.id = p.participant_id
    where p.id = ${id} and a.active
    ${options.lockAgent ? sql`for no key update of a for share of p` : sql``}
  `
  return row
}

export async function listPlans(sql: Db, participantId: string, includeInactive: boolean): Promise<PlanRow[]> {
  return sql<PlanRow[]>`
    select ${columns(sql)}
    from plans p join participants a on a.id = p.participant_id
    where p.participant_id = ${participantId} and (p.active or ${includeInactive})
    order by p.created_at, p.id
  `
}

/**
 * Locks the plan's row for a change, waiting for subscriptions to it being made (findPlan with
 * `lockAgent`): the change is to be dated after this, so that no subscription's start falls after
 * the change's date without having seen it. Returns the date of the plan's latest terms: the change
 * is dated after it too (`changeDate`), as the history keeps one version a date. Its agent's row is
 * held too (key share) in the same statement: a deactivation in flight, or one committed while the
 * plan's row was waited for, is seen, and then there is no plan (undefined) to change.
 */
export async function lockPlan(sql: Db, id: string): Promise<{ latest: Date | null } | undefined> {
  const [row] = await sql<{ latest: Date | null }[]>`
    select (select max(effective_from) from plan_terms where plan_id = p.id) as latest
    from plans p join participants a on a.id = p.participant_id
    where p.id = ${id} and a.active
    for update of p for key share of a
  `
  return row
}

/**
 * A change's date: `now`, or a millisecond after the plan's latest terms when those are no earlier.
 * Two changes in one millisecond would otherwise share a version: a drop taken back within it was
 * lost from the bill, though its notice had been sent.
 */
export function changeDate(now: Date, latest: Date | null): Date {
  return latest && latest.getTime() >= now.getTime() ? new Date(latest.getTime() + 1) : now
}

/**
 * Applies the patch, with the plan's row locked so that concurrent changes follow one another; returns
 * the terms before and after when they changed, for the caller to announce in the same transaction.
 */
export async function updatePlan(sql: Db, id: string, patch: UpdatePlan, at: Date): Promise<{ previous: PlanTerms; terms: PlanTerms } | undefined> {
  const [previous] = await sql<PlanTerms[]>`
    select monthly_price_cents as "monthlyPriceCents", included_proxy_calls as "includedProxyCalls",
      overage_per_call_cents as "overagePerCallCents"
    from plans where id = ${id}
    for update
  `
  if (!previous) return undefined
  const changes: Record<string, unknown> = {}
  if (patch.name !== undefined) changes.name = patch.name
  if (patch.description !== undefined) changes.description = patch.description
  if (patch.monthlyPriceCents !== undefined) changes.monthly_price_cents = patch.monthlyPriceCents
  if (patch.includedProxyCalls !== undefined) changes.included_proxy_calls = patch.includedProxyCalls
  if (patch.overagePerCallCents !== undefined) changes.overage_per_call_cents = patch.overagePerCallCents
  if (Object.keys(changes).length === 0) return undefined
  await sql`update plans set ${sql(changes)}, updated_at = ${at} where id = ${id}`
  const terms: PlanTerms = {
    monthlyPriceCents: patch.monthlyPriceCents ?? previous.monthlyPriceCents,
    includedProxyCalls: patch.includedProxyCalls ?? previous.includedProxyCalls,
    overagePerCallCents: patch.overagePerCallCents ?? previous.overagePerCallCents,
  }
  if (sameTerms(previous, terms)) return undefined
  await recordTerms(sql, id, at)
  return { previous, terms }
}

export async function deactivatePlan(sql: Db, id: string, at: Date): Promise<void> {
  await sql`update plans set active = false, updated_at = ${at} where id = ${id} and active`
}
