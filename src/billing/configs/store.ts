/** SQL for config listings and purchases. */
import type { Db } from '../../db.ts'
import type { CreateConfig, UpdateConfig } from './schema.ts'

export interface ConfigRow {
  id: string
  participantId: string
  ownerId: string
  name: string
  description: string | null
  priceCents: number
  fileType: string
  /** Null unless the reading user owns or bought it: the rest never leave Postgres. */
  content: string | null
  previewSnippet: string | null
  active: boolean
  createdAt: Date
  updatedAt: Date
  /** Whether the reading user bought it (false when nobody in particular reads). */
  purchased: boolean
}

/**
 * Listings as `reader` sees them, to be narrowed by a where clause. Content (up to a million
 * characters a listing) is read only where the reader may see it (owner or buyer): an agent's list
 * read by anyone else would otherwise carry every listing's content into the process.
 */
const listingsAs = (sql: Db, reader: string | null) => sql`
  select c.id, c.participant_id as "participantId", a.owner_id as "ownerId", c.name, c.description,
    c.price_cents as "priceCents", c.file_type as "fileType", c.preview_snippet as "previewSnippet",
    c.active, c.created_at as "createdAt", c.updated_at as "updatedAt",
    case when a.owner_id = ${reader} or p.purchased then c.content end as content, p.purchased
  from config_listings c join participants a on a.id = c.participant_id
  cross join lateral (
    select exists (select 1 from config_purchases cp where cp.config_id = c.id and cp.user_id = ${reader}) as purchased
  ) p
`

/**
 * Inserts a listing for an agent still active: undefined (nothing written) when it is not. The
 * agent's row is held (key share) by the insert itself, as a purchase holds it (findConfig): a
 * deactivation in flight is waited for and then seen; one begun after waits for the listing.
 */
export async function insertConfig(sql: Db, config: CreateConfig, at: Date): Promise<string | undefined> {
  const [row] = await sql<{ id: string }[]>`
    insert into config_listings (
      participant_id, name, description, price_cents, file_type, content, preview_snippet, created_at, updated_at
    )
    select
      a.id, ${config.name}, ${config.description ?? null}, ${config.priceCents},
      ${config.fileType}, ${config.content}, ${config.previewSnippet ?? null}, ${at}, ${at}
    from participants a where a.id = ${config.participantId} and a.active
    for key share
    returning id
  `
  return row?.id
}

/**
 * A listing of an active agent. With `holdAgent` (buying), the agent's row is held (key share) to
 * the end of the transaction: a deactivation (which locks it for update) in flight is waited for and
 * then seen, so no listing is sold after its agent is gone; one begun after waits for the purchase.
 */
export async function findConfig(sql: Db, id: string, reader: string | null, options: { holdAgent?: boolean } = {}): Promise<ConfigRow | undefined> {
  const [row] = await sql<ConfigRow[]>`
    ${listingsAs(sql, reader)}
    where c.id = ${id} and a.active
    ${options.holdAgent ? sql`for key share of a` : sql``}
  `
  return row
}

export async function listConfigs(sql: Db, participantId: string, reader: string | null, includeInactive: boolean): Promise<ConfigRow[]> {
  return sql<ConfigRow[]>`
    ${listingsAs(sql, reader)}
    where c.participant_id = ${participantId} and (c.active or ${includeInactive})
    order by c.created_at, c.id
  `
}

/**
 * Changes a listing of an active agent. Its agent's row is held (key share) as the listing's is
 * locked: a deactivation in flight, or one committed while the listing's row was waited for, is seen,
 * and then nothing is changed.
 */
export async function updateConfig(sql: Db, id: string, patch: UpdateConfig, at: Date): Promise<void> {
  const changes: Record<string, unknown> = {}
  if (patch.name !== undefined) changes.name = patch.name
  if (patch.description !== undefined) changes.description = patch.description
  if (patch.priceCents !== undefined) changes.price_cents = patch.priceCents
  if (patch.fileType !== undefined) changes.file_type = patch.fileType
  if (patch.content !== undefined) changes.content = patch.content
  if (patch.previewSnippet !== undefined) changes.preview_snippet = patch.previewSnippet
  if (Object.keys(changes).length === 0) return
  await sql`
    with held as (
      select c.id from config_listings c join participants a on a.id = c.participant_id
      where c.id = ${id} and a.active
      for update of c for key share of a
    )
    update config_listings set ${sql(changes)}, updated_at = ${at} where id = (select id from held)
  `
}

export async function deactivateConfig(sql: Db, id: string, at: Date): Promise<void> {
  await sql`update config_listings set active = false, updated_at = ${at} where id = ${id} and active`
}

export interface PurchaseRow {
  purchaseId: string
  configId: string
  participantId: string
  name: string
  fileType: string
  priceCents: number
  content: string
  invoiceId: string | null
  purchasedAt: Date
}

const purchaseView = (sql: Db) => sql`
  select
    cp.id as "purchaseId", cp.config_id as "configId", c.participant_id as "participantId", c.name,
    c.file_type as "fileType", cp.price_cents as "priceCents", c.content, cp.invoice_id as "invoiceId",
    cp.purchased_at as "purchasedAt", cp.user_id
  from config_purchases cp join config_listings c on c.id = cp.config_id
`

/** Records a purchase at the given price; undefined when the user already bought it. */
export async function insertPurchase(
  sql: Db,
  purchase: { configId: string; userId: string; priceCents: number },
  at: Date,
): Promise<string | undefined> {
  const [row] = await sql<{ id: string }[]>`
    insert into config_purchases (config_id, user_id, price_cents, purchased_at)
    values (${purchase.configId}, ${purchase.userId}, ${purchase.priceCents}, ${at})
    on conflict (config_id, user_id) do nothing
    returning id
  `
  return row?.id
}

export async function findPurchase(sql: Db, configId: string, userId: string): Promise<PurchaseRow | undefined> {
  const [row] = await sql<PurchaseRow[]>`
    select * from (${purchaseView(sql)}) v where v."configId" = ${configId} and v.user_id = ${userId}
  `
  return row
}

export async function listPurchases(sql: Db, userId: string): Promise<PurchaseRow[]> {
  return sql<PurchaseRow[]>`
    select * from (${purchaseView(sql)}) v where v.user_id = ${userId}
    order by v."purchasedAt" desc, v."purchaseId" desc
  `
}

/** Whether the user bought any config of the agent. */
export async function hasBoughtFrom(sql: Db, userId: string, participantId: string): Promise<boolean> {
  const [row] = await sql`
    select 1 from config_purchases cp join config_listings c on c.id = cp.config_id
    where cp.user_id = ${userId} and c.participant_id = ${participantId}
    limit 1
  `
  return row !== undefined
}
