/** /v1/billing/subscriptions: subscribe to a plan, list your subscriptions, cancel. */
import { Elysia, t } from 'elysia'
import type { DatabaseIdentity, Sql } from '../../db.ts'
import type { Redis } from '../../redis.ts'
import type { Keys } from '../../keys.ts'
import type { Clock } from '../../clock.ts'
import type { RateLimiter } from '../../rate-limit/token-bucket.ts'
import { errors } from '../../errors.ts'
import { uniqueViolation } from '../../db.ts'
import { BeforeParam, failures, iso, isoOrNull, Ok, ok, pageLimit, parseBefore, Query, Uuid } from '../../http/schema.ts'
import type { AuthPlugin } from '../../auth/plugin.ts'
import { principalSubject } from '../../auth/principal.ts'
import { IdempotencyHeaders, idempotent } from '../../idempotency/idempotent.ts'
import { findPlan } from '../plans/store.ts'
import { liveCounts } from './usage-counter.ts'
import { enqueueEvents } from '../../events/outbox.ts'
import { participantOwner } from '../../participants/store.ts'
import { CreateSubscription, Subscription } from './schema.ts'
import {
  adjustActiveSubscribers,
  cancelSubscription,
  findSubscription,
  firstPeriodTerms,
  insertSubscription,
  listSubscriptions,
  type PeriodTerms,
  type SubscriptionRow,
} from './store.ts'

const listLimit = pageLimit(50, 100)

export const subscriptionView = (row: SubscriptionRow): Subscription => ({
  id: row.id,
  planId: row.planId,
  participantId: row.participantId,
  participantName: row.participantName,
  planName: row.planName,
  status: row.status,
  currentPeriodStart: iso(row.currentPeriodStart),
  currentPeriodEnd: iso(row.currentPeriodEnd),
  usage: { proxyCalls: row.proxyCalls, includedProxyCalls: row.includedProxyCalls },
  createdAt: iso(row.createdAt),
  cancelledAt: isoOrNull(row.cancelledAt),
})

const sameTerms = (a: PeriodTerms, b: PeriodTerms) =>
  a.monthlyPriceCents === b.monthlyPriceCents && a.includedProxyCalls === b.includedProxyCalls && a.overagePerCallCents === b.overagePerCallCents

/** What the subscription routes use; Redis, keys and database for the live counts. */
export interface RouteDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  database: DatabaseIdentity
  clock: Clock
  rateLimiter: RateLimiter
}

export function subscriptionRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, clock, rateLimiter } = deps

  return new Elysia({ prefix: '/subscriptions', tags: ['billing'] })
    .use(auth)
    .post(
      '',
      async ({ user, body, headers, set }) => {
        const outcome = await idempotent(
          deps,
          {
            subject: principalSubject(user),
            key: headers['idempotency-key'],
            method: 'POST',
            path: '/v1/billing/subscriptions',
            body,
          },
          async tx => {
            // Taken only for a request the key has not answered before: a replay costs nothing.
            await rateLimiter.take('subscriptionCreate', `user:${user.userId}`)
            const plan = await findPlan(tx, body.planId, { lockAgent: true })
            if (!plan) throw errors.notFound('Plan')
            if (plan.ownerId === user.userId) throw errors.cannotSubscribeOwnAgent()
            if (!plan.active) throw errors.planInactive()
            const startedAt = clock.now()
            let id: string
            try {
              id = await tx.savepoint(savepoint =>
                insertSubscription(savepoint, {
                  userId: user.userId,
                  participantId: plan.participantId,
                  planId: plan.id,
                  startedAt,
                }),
              )
            } catch (error) {
              if (uniqueViolation(error) === 'subscriptions_one_active') throw errors.alreadySubscribed()
              throw error
            }
            // The terms the first period was given, whatever changed meanwhile: those are what is billed.
            const terms = await firstPeriodTerms(tx, id)
            if (body.expectedTerms && !sameTerms(terms, body.expectedTerms)) throw errors.termsChanged(terms)
            await adjustActiveSubscribers(tx, plan.participantId, 1)
            const payload = { subscriptionId: id, participantId: plan.participantId, planId: plan.id, userId: user.userId }
            await enqueueEvents(tx, startedAt, [{ userId: plan.ownerId, type: 'subscription.created', payload }])
            return { status: 201, body: ok(subscriptionView((await findSubscription(tx, id, user.userId, startedAt))!)) }
          },
        )
        set.status = outcome.status
        return outcome.body as { success: true; data: Subscription }
      },
      {
        user: true,
        body: CreateSubscription,
        headers: IdempotencyHeaders,
        response: { 201: Ok(Subscription), ...failures(400, 401, 403, 404, 409, 429) },
        detail: {
          operationId: 'subscribe',
          summary: 'Subscribe to a plan (one active subscription per agent; honours Idempotency-Key)',
          description:
            'Needs a user credential. The plan’s agent must be active (else 404) and not the caller’s (403 ' +
            '`cannot_subscribe_own_agent`). An inactive plan is 409 `plan_inactive`; ' +
            'a second active subscription to the agent is 409 `already_subscribed`. Periods run one calendar month from now. ' +
            'Send `expectedTerms` (the plan’s terms as shown): the first period given other terms (the owner changed them ' +
            'meanwhile) is 409 `price_changed`, and nothing is created. A repeat with the same `Idempotency-Key` gets the ' +
            'first answer (a replay takes no token). Rate limited per user (rule `subscriptionCreate`): 429.',
        },
      },
    )
    .get(
      '',
      async ({ user, query }) => {
        const page = { limit: listLimit.parse(query.limit), before: parseBefore(query.before, '/before') }
        const rows = await listSubscriptions(sql, user.userId, page, clock.now())
        // Calls metered but not yet counted by the worker are in the live counters.
        const live = await liveCounts(
          deps,
          rows.map(row => ({ subscriptionId: row.id, periodIndex: row.periodIndex })),
        )
        return ok(rows.map((row, i) => subscriptionView({ ...row, proxyCalls: Math.max(row.proxyCalls, live[i] ?? 0) })))
      },
      {
        user: true,
        query: Query({ limit: listLimit.param, before: BeforeParam }),
        response: { 200: Ok(t.Array(Subscription)), ...failures(400, 401, 403) },
        detail: {
          operationId: 'listSubscriptions',
          summary: 'The caller’s subscriptions, active and cancelled, newest first (default 50, max 100)',
          description:
            'Needs a user credential. Pages with `limit` and `before` (subscriptions created strictly before that time); no two ' +
            'of a user’s subscriptions share a `createdAt`, so a page never ends among subscriptions the next would skip. ' +
            '`usage.proxyCalls` counts the calls of the period shown, including calls the metering worker has not counted ' +
            'yet.',
        },
      },
    )
    .delete(
      '/:id',
      async ({ user, params }) => {
        const row = await sql.begin(async tx => {
          const now = clock.now()
          const cancelled = await cancelSubscription(tx, params.id, user.userId, now)
          if (cancelled.result !== 'cancelled') {
            throw cancelled.result === 'missing' ? errors.notFound('Subscription') : errors.alreadyCancelled()
          }
          await adjustActiveSubscribers(tx, cancelled.participantId, -1)
          const row = (await findSubscription(tx, params.id, user.userId, now))!
          const ownerId = await participantOwner(tx, row.participantId)
          if (ownerId) {
            const payload = { subscriptionId: row.id, participantId: row.participantId, planId: row.planId, userId: user.userId }
            await enqueueEvents(tx, now, [{ userId: ownerId, type: 'subscription.cancelled', payload }])
          }
          return row
        })
        return ok(subscriptionView(row))
      },
      {
        user: true,
        params: t.Object({ id: Uuid }),
        parse: 'none',
        response: { 200: Ok(Subscription), ...failures(400, 401, 403, 404, 409) },
        detail: {
          operationId: 'cancelSubscription',
          summary: 'Cancel; the period it was cancelled in is still invoiced',
          description:
            'Needs a user credential; another user’s subscription is 404, one already cancelled 409 `already_cancelled`. ' +
            'Access ends at once: messages to the agent, and its proxy calls and context access for the user, are 403 ' +
            '`not_subscribed`. The agent’s owner gets `subscription.cancelled`.',
        },
      },
    )
}
