/**
 * How a change of a plan's terms reaches its existing subscribers: each is told at once (`plan.changed`
 * on their stream), and a rise is billed only from the period after their next one, so a whole period
 * at the old terms lies between the notice and the first period at the new ones. Lower prices and more
 * included calls apply from their next period. `ensurePeriods` (subscriptions/store.ts) bills by the same rule.
 */
import type { Db } from '../../db.ts'

export interface PlanTerms {
  monthlyPriceCents: number
  includedProxyCalls: number
  overagePerCallCents: number
}

/** Whether `next` is worse for a subscriber than `previous` in any term. */
export function raises(previous: PlanTerms, next: PlanTerms): boolean {
  return (
    next.monthlyPriceCents > previous.monthlyPriceCents ||
    next.overagePerCallCents > previous.overagePerCallCents ||
    next.includedProxyCalls < previous.includedProxyCalls
  )
}

export function sameTerms(a: PlanTerms, b: PlanTerms): boolean {
  return (
    a.monthlyPriceCents === b.monthlyPriceCents && a.includedProxyCalls === b.includedProxyCalls && a.overagePerCallCents === b.overagePerCallCents
  )
}

/**
 * Records a `plan.changed` event for every active subscriber of the plan, in the caller's transaction,
 * each with `effectiveFrom`: the start of their first period billed wholly at the new terms (the
 * period after their next for a rise, their next otherwise). Set-based, however many subscribers.
 */
export async function announcePlanChange(
  tx: Db,
  plan: { id: string; name: string; participantId: string },
  change: { previous: PlanTerms; terms: PlanTerms },
  at: Date,
): Promise<number> {
  return (await planChangeEvents(tx, plan, change, at)).length
}

/**
 * The statement recording the events, unsent until awaited, so a test can also explain it. A plan's
 * subscriptions are its agent's (a subscription takes the agent from its plan), found through an
 * index by agent: subscriptions have none by plan, and each change of any plan read every
 * subscription of the marketplace (505,000: 74 to 146 ms for a plan of 6 subscribers; now 0.2 to
 * 1.4 ms).
 */
export function planChangeEvents(
  tx: Db,
  plan: { id: string; name: string; participantId: string },
  change: { previous: PlanTerms; terms: PlanTerms },
  at: Date,
) {
  const periodsAhead = raises(change.previous, change.terms) ? 2 : 1
  return tx`
    insert into outbox (user_id, type, data)
    select s.user_id, 'plan.changed', json_build_object(
      'type', 'plan.changed', 'createdAt', ${at.toISOString()}::text,
      'planId', ${plan.id}::uuid, 'planName', ${plan.name}::text, 'participantId', ${plan.participantId}::uuid,
      'subscriptionId', s.id, 'previous', ${JSON.stringify(change.previous)}::text::json, 'terms', ${JSON.stringify(change.terms)}::text::json,
      'effectiveFrom', to_char(
        (s.started_at + make_interval(months => current.k + ${periodsAhead})) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'
      )
    )::text
    from subscriptions s
    -- the index of the period holding the change: the last month boundary from the start passed by then
    cross join lateral (
      select coalesce(max(k), 0) as k
      from generate_series(
        0,
        greatest(0, ((extract(year from ${at}::timestamptz) - extract(year from s.started_at)) * 12
          + extract(month from ${at}::timestamptz) - extract(month from s.started_at))::int)
      ) k
      where s.started_at + make_interval(months => k) <= ${at}::timestamptz
    ) current
    where s.participant_id = ${plan.participantId} and s.status = 'active' and s.plan_id = ${plan.id}
    order by s.id
    returning 1
  `
}
