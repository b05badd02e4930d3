/** /v1/billing/plans: owners price their agents; anyone signed in reads the active plans. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../../db.ts'
import type { Clock } from '../../clock.ts'
import type { RateLimiter } from '../../rate-limit/token-bucket.ts'
import { errors } from '../../errors.ts'
import { Ok, failures, iso, ok, UuidOf } from '../../http/schema.ts'
import type { AuthPlugin } from '../../auth/plugin.ts'
import { requireOwnedParticipant, requireParticipant } from '../../participants/ownership.ts'
import { CreatePlan, DeactivatedPlan, Plan, UpdatePlan } from './schema.ts'
import { announcePlanChange } from './price-change.ts'
import { changeDate, deactivatePlan, findPlan, insertPlan, listPlans, lockPlan, updatePlan, type PlanRow } from './store.ts'

export const planView = (row: PlanRow): Plan => ({
  id: row.id,
  participantId: row.participantId,
  name: row.name,
  description: row.description,
  monthlyPriceCents: row.monthlyPriceCents,
  includedProxyCalls: row.includedProxyCalls,
  overagePerCallCents: row.overagePerCallCents,
  active: row.active,
  createdAt: iso(row.createdAt),
  updatedAt: iso(row.updatedAt),
})

const PlanId = t.Object({ id: UuidOf('The plan’s id') })

/** What the plan routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  rateLimiter: RateLimiter
}

export function planRoutes({ sql, clock, rateLimiter }: RouteDeps, auth: AuthPlugin) {
  const ownedPlan = async (planId: string, userId: string) => {
    const plan = await findPlan(sql, planId)
    if (!plan) throw errors.notFound('Plan')
    if (plan.ownerId !== userId) throw errors.forbidden('You do not own this agent')
    return plan
  }

  return new Elysia({ prefix: '/plans', tags: ['billing'] })
    .use(auth)
    .post(
      '',
      async ({ user, body, set }) => {
        await requireOwnedParticipant(sql, body.participantId, user.userId)
        await rateLimiter.take('planWrite', `user:${user.userId}`)
        // Written only while its agent is active: one deactivated since the check above gets no plan.
        const id = await sql.begin(tx => insertPlan(tx, body, clock.now()))
        if (!id) throw errors.notFound('Participant')
        // Its agent may have been deactivated since the plan was written: then there is no plan to show.
        const created = await findPlan(sql, id)
        if (!created) throw errors.notFound('Participant')
        set.status = 201
        return ok(planView(created))
      },
      {
        user: true,
        body: CreatePlan,
        response: { 201: Ok(Plan), ...failures(400, 401, 403, 404, 429) },
        detail: {
          operationId: 'createPlan',
          summary: 'Create a plan for an agent you own',
          description:
            'Needs the agent owner’s user credential: another user is 403, an unknown or deactivated agent 404. ' +
            'The plan is active at once. Each period includes `includedProxyCalls` proxy calls; ' +
            'each call past them costs `overagePerCallCents`. Users subscribe with POST /v1/billing/subscriptions. Rate limited per user with changes (rule `planWrite`): 429.',
        },
      },
    )
    .get(
      '/:id',
      async ({ caller, params }) => {
        const participant = await requireParticipant(sql, params.id)
        const isOwner = caller.kind === 'user' && caller.userId === participant.ownerId
        return ok((await listPlans(sql, participant.id, isOwner)).map(planView))
      },
      {
        caller: true,
        params: t.Object({ id: UuidOf('The agent’s id (participantId)') }),
        response: { 200: Ok(t.Array(Plan)), ...failures(400, 401, 404) },
        detail: {
          operationId: 'listPlans',
          summary: 'An agent’s active plans (the owner also sees inactive ones)',
          description:
            'Any credential: a user’s (bearer JWT or `sk_usr_` key) or an agent’s key. Plans are oldest first, not paged. ' +
            'An unknown or deactivated agent is 404.',
        },
      },
    )
    .patch(
      '/:id',
      async ({ user, params, body }) => {
        const plan = await ownedPlan(params.id, user.userId)
        await rateLimiter.take('planWrite', `user:${user.userId}`)
        await sql.begin(async tx => {
          // Dated once the row is ours: a subscription being made meanwhile starts before this date
          // (so it is told of the change, and billed as told), never after it.
          const locked = await lockPlan(tx, params.id)
          // Its agent deactivated since the check above: nothing is changed.
          if (!locked) throw errors.notFound('Plan')
          const at = changeDate(clock.now(), locked.latest)
          const change = await updatePlan(tx, params.id, body, at)
          if (change) await announcePlanChange(tx, { id: plan.id, name: body.name ?? plan.name, participantId: plan.participantId }, change, at)
        })
        // Its agent may have been deactivated meanwhile: then there is no plan to show.
        const updated = await findPlan(sql, params.id)
        if (!updated) throw errors.notFound('Plan')
        return ok(planView(updated))
      },
      {
        user: true,
        params: PlanId,
        body: UpdatePlan,
        response: { 200: Ok(Plan), ...failures(400, 401, 403, 404, 429) },
        detail: {
          operationId: 'updatePlan',
          summary:
            'Change a plan. Existing subscribers are told at once (plan.changed); a rise reaches them from the period after their next, ' +
            'lower prices and more included calls from their next',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown plan or a deactivated agent 404. ' +
            'Fields left out stay; an inactive plan can be changed too. Only a change of price or included calls sends ' +
            '`plan.changed`, with `effectiveFrom`, to each active subscriber. Rate limited per user with creations (rule `planWrite`): 429.',
        },
      },
    )
    .delete(
      '/:id',
      async ({ user, params }) => {
        await ownedPlan(params.id, user.userId)
        await deactivatePlan(sql, params.id, clock.now())
        return ok({ id: params.id, active: false as const })
      },
      {
        user: true,
        params: PlanId,
        parse: 'none',
        response: { 200: Ok(DeactivatedPlan), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'deactivatePlan',
          summary: 'Deactivate a plan: no new subscriptions, existing ones go on',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown plan or a deactivated agent 404. ' +
            'New subscriptions are then 409 `plan_inactive`; existing ones are billed on as before. ' +
            'The owner still sees the plan, with `active: false`. A second call answers the same.',
        },
      },
    )
}
