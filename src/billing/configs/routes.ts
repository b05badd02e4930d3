/** /v1/billing/configs and /v1/billing/my-configs: owners sell config files; users buy them once. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../../db.ts'
import type { Clock } from '../../clock.ts'
import type { RateLimiter } from '../../rate-limit/token-bucket.ts'
import { errors } from '../../errors.ts'
import { Ok, failure, failures, iso, ok, UuidOf } from '../../http/schema.ts'
import type { AuthPlugin } from '../../auth/plugin.ts'
import type { Principal } from '../../auth/principal.ts'
import { principalSubject } from '../../auth/principal.ts'
import { IdempotencyHeaders, idempotent } from '../../idempotency/idempotent.ts'
import { requireOwnedParticipant, requireParticipant } from '../../participants/ownership.ts'
import { ConfigListing, CreateConfig, DeactivatedConfig, MyConfig, Purchase, PurchaseRequest, UpdateConfig } from './schema.ts'
import { deactivateConfig, findConfig, insertConfig, listConfigs, listPurchases, updateConfig, type ConfigRow, type PurchaseRow } from './store.ts'
import { buyConfig } from './purchase.ts'

const readerId = (principal: Principal) => (principal.kind === 'user' ? principal.userId : null)

/** Content shows to the owner and to buyers only. */
const configView = (row: ConfigRow, reader: Principal): ConfigListing => {
  const canRead = row.purchased || (reader.kind === 'user' && reader.userId === row.ownerId)
  return {
    id: row.id,
    participantId: row.participantId,
    name: row.name,
    description: row.description,
    priceCents: row.priceCents,
    fileType: row.fileType,
    previewSnippet: row.previewSnippet,
    active: row.active,
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
    ...(canRead && row.content !== null ? { content: row.content } : {}),
  }
}

const purchaseView = (row: PurchaseRow): Purchase => ({
  purchaseId: row.purchaseId,
  configId: row.configId,
  priceCents: row.priceCents,
  content: row.content,
  invoiceId: row.invoiceId,
  purchasedAt: iso(row.purchasedAt),
})

const ConfigId = t.Object({ id: UuidOf('The listing’s id (configId)') })

/** What the config listing and purchase routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  rateLimiter: RateLimiter
}

export function configRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia().use(listingRoutes(deps, auth)).use(purchaseRoutes(deps, auth))
}

/** Owners list, change and withdraw their configs; any caller reads the listings. */
function listingRoutes({ sql, clock, rateLimiter }: RouteDeps, auth: AuthPlugin) {
  const ownedConfig = async (configId: string, userId: string) => {
    const config = await findConfig(sql, configId, userId)
    if (!config) throw errors.notFound('Config')
    if (config.ownerId !== userId) throw errors.forbidden('You do not own this agent')
    return config
  }

  return new Elysia({ tags: ['billing'] })
    .use(auth)
    .post(
      '/configs',
      async ({ user, body, set }) => {
        await requireOwnedParticipant(sql, body.participantId, user.userId)
        await rateLimiter.take('configWrite', `user:${user.userId}`)
        // Written only while its agent is active: one deactivated since the check above gets no listing.
        const id = await insertConfig(sql, body, clock.now())
        if (!id) throw errors.notFound('Participant')
        // Its agent may have been deactivated since the listing was written: then there is none to show.
        const created = await findConfig(sql, id, user.userId)
        if (!created) throw errors.notFound('Participant')
        set.status = 201
        return ok(configView(created, user))
      },
      {
        user: true,
        body: CreateConfig,
        response: { 201: Ok(ConfigListing), ...failures(400, 401, 403, 404, 413, 429) },
        detail: {
          operationId: 'createConfig',
          summary: 'List a config file for sale (bodies up to 2 MiB)',
          description:
            'Needs the agent owner’s user credential: another user is 403, an unknown or deactivated agent 404. ' +
            'The listing is on sale at once. `content` (up to 1,000,000 characters) is shown only to the owner and to buyers; ' +
            'others see `previewSnippet`. Rate limited per user, with changes (rule `configWrite`): 429.',
        },
      },
    )
    .get(
      '/configs/:id',
      async ({ caller, params }) => {
        const participant = await requireParticipant(sql, params.id)
        const isOwner = caller.kind === 'user' && caller.userId === participant.ownerId
        const rows = await listConfigs(sql, participant.id, readerId(caller), isOwner)
        return ok(rows.map(row => configView(row, caller)))
      },
      {
        caller: true,
        params: t.Object({ id: UuidOf('The agent’s id (participantId)') }),
        response: { 200: Ok(t.Array(ConfigListing)), ...failures(400, 401, 404) },
        detail: {
          operationId: 'listConfigs',
          summary: 'An agent’s active listings; content only for buyers (the owner sees all, with content)',
          description:
            'Any credential: a user’s or an agent’s key; an agent key sees no `content`. Oldest first, not paged. ' +
            'An unknown or deactivated agent is 404.',
        },
      },
    )
    .patch(
      '/configs/:id',
      async ({ user, params, body }) => {
        await ownedConfig(params.id, user.userId)
        await rateLimiter.take('configWrite', `user:${user.userId}`)
        await updateConfig(sql, params.id, body, clock.now())
        // Its agent may have been deactivated meanwhile: then there is no listing to show.
        const updated = await findConfig(sql, params.id, user.userId)
        if (!updated) throw errors.notFound('Config')
        return ok(configView(updated, user))
      },
      {
        user: true,
        params: ConfigId,
        body: UpdateConfig,
        response: { 200: Ok(ConfigListing), ...failures(400, 401, 403, 404, 413, 429) },
        detail: {
          operationId: 'updateConfig',
          summary: 'Change a listing (owner)',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown listing or a deactivated agent 404. ' +
            'Fields left out stay; bodies up to 2 MiB. A new `priceCents` applies to later purchases only. ' +
            'Buyers see new `content` in GET /v1/billing/my-configs. Rate limited per user, with creations (rule `configWrite`): 429.',
        },
      },
    )
    .delete(
      '/configs/:id',
      async ({ user, params }) => {
        await ownedConfig(params.id, user.userId)
        await deactivateConfig(sql, params.id, clock.now())
        return ok({ id: params.id, active: false as const })
      },
      {
        user: true,
        params: ConfigId,
        parse: 'none',
        response: { 200: Ok(DeactivatedConfig), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'deactivateConfig',
          summary: 'Take a listing off sale; buyers keep it',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown listing or a deactivated agent 404. ' +
            'New purchases are then 409 `config_inactive`; buyers still read the content in GET /v1/billing/my-configs. ' +
            'A second call answers the same.',
        },
      },
    )
}

/** Users buy a config once and read what they bought. */
function purchaseRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, clock, rateLimiter } = deps
  return new Elysia({ tags: ['billing'] })
    .use(auth)
    .post(
      '/configs/:id/purchase',
      async ({ user, params, body, headers, set }) => {
        const expectedPriceCents = body?.expectedPriceCents
        const outcome = await idempotent(
          deps,
          {
            subject: principalSubject(user),
            key: headers['idempotency-key'],
            method: 'POST',
            path: `/v1/billing/configs/${params.id}/purchase`,
            body: expectedPriceCents === undefined ? null : { expectedPriceCents },
          },
          async tx => {
            // Taken only for a purchase the key has not answered before: a replay costs nothing.
            await rateLimiter.take('configPurchase', `user:${user.userId}`)
            const { created, row } = await buyConfig(tx, { configId: params.id, userId: user.userId, expectedPriceCents, at: clock.now() })
            return { status: created ? 201 : 200, body: ok(purchaseView(row)) }
          },
        )
        set.status = outcome.status
        return outcome.body as { success: true; data: Purchase }
      },
      {
        user: true,
        params: ConfigId,
        body: PurchaseRequest,
        headers: IdempotencyHeaders,
        response: {
          201: Ok(Purchase),
          200: Ok(Purchase),
          ...failures(400, 401, 403, 404, 429),
          409: failure(
            'config_inactive: no longer for sale; price_changed: the listing’s price is not the expectedPriceCents sent (nothing charged); ' +
              'idempotency_key_reused',
          ),
        },
        detail: {
          operationId: 'purchaseConfig',
          summary:
            'Buy a config and get its content: 201 the first time, 200 with the same purchase after. Send expectedPriceCents to be charged that or nothing',
          description:
            'Needs a user credential. One’s own listing is 403 `cannot_buy_own_config`; ' +
            'an inactive one is 409 `config_inactive`; an unknown one, or one whose agent is deactivated, 404. ' +
            'A buyer buying again gets the same purchase with 200 whatever became of the listing or its agent since. A purchase issues its one-line invoice at once and tells the owner ' +
            '(`config.purchased`). A repeat charges nothing. A repeat with the same `Idempotency-Key` within 24 h gets the ' +
            'first answer. Rate limited per user, repeats too (rule `configPurchase`): 429.',
        },
      },
    )
    .get(
      '/my-configs',
      async ({ user }) =>
        ok(
          (await listPurchases(sql, user.userId)).map(row => ({
            purchaseId: row.purchaseId,
            configId: row.configId,
            participantId: row.participantId,
            name: row.name,
            fileType: row.fileType,
            priceCents: row.priceCents,
            content: row.content,
            purchasedAt: iso(row.purchasedAt),
          })),
        ),
      {
        user: true,
        response: { 200: Ok(t.Array(MyConfig)), ...failures(401, 403) },
        detail: {
          operationId: 'listMyConfigs',
          summary: 'Configs the caller bought, with their current content',
          description:
            'Needs a user credential. Every purchase, newest first, not paged, with the price paid and the listing’s content ' +
            'as it is now. Listings taken off sale stay here.',
        },
      },
    )
}
