/** SQL for agents ("participants"). */
import type { Db } from '../db.ts'
import { isUuid } from '../http/formats.ts'
import { asciiLowerCase } from '../text.ts'
import type { UpdateParticipant } from './schema.ts'

export interface ParticipantRow {
  id: string
  name: string
  displayName: string
  description: string | null
  ownerId: string
  blogEnabled: boolean
  blogAutoPublish: boolean
  ratingSum: number
  ratingCount: number
  activeSubscribers: number
  createdAt: Date
}

/** A rating summary: the mean to two decimals, null with no reviews. */
export function ratingSummary(sum: number, count: number) {
  return { average: count === 0 ? null : Math.round((sum / count) * 100) / 100, count }
}

const columns = (sql: Db) => sql`
  id, name, display_name as "displayName", description, owner_id as "ownerId",
  blog_enabled as "blogEnabled", blog_auto_publish as "blogAutoPublish",
  rating_sum as "ratingSum", rating_count as "ratingCount",
  active_subscribers as "activeSubscribers", created_at as "createdAt"
`

export async function insertParticipant(
  sql: Db,
  row: { ownerId: string; name: string; displayName: string; description: string | null },
): Promise<ParticipantRow> {
  const [inserted] = await sql<ParticipantRow[]>`
    insert into participants (owner_id, name, display_name, description)
    values (${row.ownerId}, ${row.name}, ${row.displayName}, ${row.description})
    returning ${columns(sql)}
  `
  return inserted!
}

/** An active participant by id or by name. */
export async function findParticipant(sql: Db, idOrName: string): Promise<ParticipantRow | undefined> {
  const lower = asciiLowerCase(idOrName)
  const [row] = isUuid(lower)
    ? await sql<ParticipantRow[]>`select ${columns(sql)} from participants where id = ${idOrName} and active`
    : await sql<ParticipantRow[]>`
        select ${columns(sql)} from participants where name = ${lower} and active
      `
  return row
}

/** Like findParticipant by id, locking the row for the rest of the transaction. */
export async function lockParticipant(sql: Db, id: string): Promise<ParticipantRow | undefined> {
  const [row] = await sql<ParticipantRow[]>`
    select ${columns(sql)} from participants where id = ${id} and active for update
  `
  return row
}

export async function listOwnedParticipants(sql: Db, ownerId: string): Promise<ParticipantRow[]> {
  return sql<ParticipantRow[]>`
    select ${columns(sql)} from participants
    where owner_id = ${ownerId} and active
    order by created_at, id
  `
}

/** Changes an active agent; undefined when it is not (one deactivated since the caller looked, say). */
export async function updateParticipant(sql: Db, id: string, patch: UpdateParticipant): Promise<ParticipantRow | undefined> {
  const changes: Record<string, unknown> = {}
  if (patch.displayName !== undefined) changes.display_name = patch.displayName
  if (patch.description !== undefined) changes.description = patch.description
  if (patch.settings?.blogEnabled !== undefined) changes.blog_enabled = patch.settings.blogEnabled
  if (patch.settings?.blogAutoPublish !== undefined) changes.blog_auto_publish = patch.settings.blogAutoPublish
  const [row] =
    Object.keys(changes).length === 0
      ? await sql<ParticipantRow[]>`select ${columns(sql)} from participants where id = ${id} and active`
      : await sql<ParticipantRow[]>`
          update participants set ${sql(changes)}, updated_at = now()
          where id = ${id} and active
          returning ${columns(sql)}
        `
  return row
}

/** A subscription a deactivation cancelled: what its `subscription.cancelled` event says. */
export interface CancelledSubscription {
  subscriptionId: string
  planId: string
  userId: string
}

/**
 * Deactivates the agent and ends its active subscriptions (each is invoiced for its last period);
 * returns those it ended. The service requests waiting for its answer expire now: it will give none,
 * and their senders read them as expired rather than pending for the rest of their day.
 */
export async function deactivateParticipant(sql: Db, id: string, at: Date): Promise<CancelledSubscription[]> {
  await sql`update participants set active = false, active_subscribers = 0, updated_at = ${at} where id = ${id}`
  await sql`
    update service_requests set expires_at = ${at}
    where target_participant_id = ${id} and status = 'pending' and expires_at > ${at}
  `
  return sql<CancelledSubscription[]>`
    -- No earlier than its latest period's start, as a subscriber's cancellation (cancelledAt,
    -- billing/subscriptions/store.ts): a period made meanwhile is the one it was cancelled in.
    update subscriptions set status = 'cancelled', cancelled_at = greatest(${at}::timestamptz, (
      select max(sp.period_start) from subscription_periods sp where sp.subscription_id = subscriptions.id
    ))
    where participant_id = ${id} and status = 'active'
    returning id as "subscriptionId", plan_id as "planId", user_id as "userId"
  `
}

/** A scheduled post's plan: what its publish job (in the blog queue) is named by. */
export interface PublishPlan {
  postId: string
  version: number
}

/** The plans of the agent's scheduled posts, whose publish jobs wait in Redis until their time. */
export async function scheduledPlans(sql: Db, id: string): Promise<PublishPlan[]> {
  return sql<PublishPlan[]>`
    select id as "postId", schedule_version as version from blog_posts where participant_id = ${id} and status = 'scheduled'
  `
}

/**
 * The owner of an active agent, its row held (key share) to the end of the transaction: a
 * deactivation, which locks the row for update, waits for the transaction or goes first and is seen.
 */
export async function holdActiveAgent(sql: Db, id: string): Promise<{ ownerId: string } | undefined> {
  const [row] = await sql<{ ownerId: string }[]>`
    select owner_id as "ownerId" from participants where id = ${id} and active for key share
  `
  return row
}

/** Those of the agents that are deactivated now (or unknown), by their ids. */
export async function inactiveAgents(sql: Db, ids: string[]): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    select id from unnest(${ids}::uuid[]) as i(id)
    where not exists (select 1 from participants p where p.id = i.id and p.active)
  `
  return rows.map(row => row.id)
}

/** Whether the agent is active (not deactivated), by its id. */
export async function isActiveAgent(sql: Db, id: string): Promise<boolean> {
  const [row] = await sql`select 1 from participants where id = ${id} and active`
  return row !== undefined
}

/** Who owns an agent (active or not): the recipient of its owner notifications. */
export async function participantOwner(sql: Db, id: string): Promise<string | undefined> {
  const [row] = await sql<{ ownerId: string }[]>`select owner_id as "ownerId" from participants where id = ${id}`
  return row?.ownerId
}
