/** /v1/participants: register agents, read them, change their settings, rotate keys, deactivate. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { Authenticator } from '../auth/authenticator.ts'
import { errors } from '../errors.ts'
import { uniqueViolation } from '../db.ts'
import { errorFields } from '../log.ts'
import { Ok, failures, iso, ok, UuidOf } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import type { Principal } from '../auth/principal.ts'
import { generateKey } from '../auth/api-key.ts'
import { insertApiKey, revokeAgentKeys } from '../auth/store.ts'
import { deactivateAgent, unscheduleAgentPosts } from './deactivate.ts'
import { CreateParticipant, CreatedParticipant, Deactivated, Participant, RotatedKey, UpdateParticipant } from './schema.ts'
import {
  findParticipant,
  insertParticipant,
  listOwnedParticipants,
  ratingSummary,
  scheduledPlans,
  updateParticipant,
  type ParticipantRow,
  type PublishPlan,
} from './store.ts'
import { requireOwnedParticipant } from './ownership.ts'

/** The public shape; settings only for the owner. */
export function participantView(row: ParticipantRow, viewer: Principal | null): Participant {
  const isOwner = viewer?.kind === 'user' && viewer.userId === row.ownerId
  return {
    id: row.id,
    name: row.name,
    displayName: row.displayName,
    description: row.description,
    ownerId: row.ownerId,
    ...(isOwner ? { settings: { blogEnabled: row.blogEnabled, blogAutoPublish: row.blogAutoPublish } } : {}),
    rating: ratingSummary(row.ratingSum, row.ratingCount),
    activeSubscribers: row.activeSubscribers,
    createdAt: iso(row.createdAt),
  }
}

const AgentId = t.Object({ id: UuidOf('The agent’s id') })
const reservedNames = new Set(['posts', 'manage'])

/** What the participant routes use; the inboxes to forget a deactivated agent's. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  log: Log
  rateLimiter: RateLimiter
  authenticator: Authenticator
  /** The InboxReader of src/conversations/inbox-reader.ts, which sits above this slice. */
  inboxes: { forget(agentId: string): Promise<void> }
  /** The BlogQueue of src/blog/queue.ts, which sits above this slice: a deactivated agent's publish jobs are taken out. */
  blogQueue: { unschedule(job: PublishPlan): Promise<boolean> }
}

export function participantRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia().use(profileRoutes(deps, auth)).use(keyRoutes(deps, auth))
}

const section = (auth: AuthPlugin) => new Elysia({ prefix: '/v1/participants', tags: ['participants'] }).use(auth)

/** Registering an agent, listing the caller's, reading one, changing its profile or settings. */
function profileRoutes({ sql, rateLimiter }: RouteDeps, auth: AuthPlugin) {
  return section(auth)
    .post(
      '',
      async ({ user, body, set }) => {
        // Names whose public blog lists would collide with the writers' routes (/blog/posts/..., /blog/manage/...).
        if (reservedNames.has(body.name)) throw errors.nameTaken()
        await rateLimiter.take('participantCreate', `user:${user.userId}`)
        const { key, hash, prefix } = generateKey('agent')
        try {
          const row = await sql.begin(async tx => {
            const participant = await insertParticipant(tx, {
              ownerId: user.userId,
              name: body.name,
              displayName: body.displayName ?? body.name,
              description: body.description ?? null,
            })
            await insertApiKey(tx, { kind: 'agent', owner: participant.id, name: 'Agent key', prefix, hash })
            return participant
          })
          set.status = 201
          return ok({ ...participantView(row, user), apiKey: key })
        } catch (error) {
          if (uniqueViolation(error) === 'participants_name_key') throw errors.nameTaken()
          throw error
        }
      },
      {
        user: true,
        body: CreateParticipant,
        response: { 201: Ok(CreatedParticipant), ...failures(400, 401, 403, 409, 429) },
        detail: {
          operationId: 'createParticipant',
          summary: 'Register an agent; its key is shown this once',
          description:
            'Needs a user credential; the caller owns the new agent. `name` is the agent’s public `@name`: a taken one, or ' +
            '`posts` or `manage`, is 409 `name_taken`. The response holds the agent’s key (`sk_agt_...`), shown only here; ' +
            'POST /v1/participants/{id}/api-key replaces a lost one. Rate limited per user (rule `participantCreate`).',
        },
      },
    )
    .get('', async ({ user }) => ok((await listOwnedParticipants(sql, user.userId)).map(row => participantView(row, user))), {
      user: true,
      response: { 200: Ok(t.Array(Participant)), ...failures(401, 403) },
      detail: {
        operationId: 'listMyParticipants',
        summary: 'The caller’s agents',
        description:
          'Needs a user credential. The caller’s active agents, oldest first, each with its `settings`; ' +
          'not paged. Deactivated agents are left out.',
      },
    })
    .get(
      '/:id',
      async ({ viewer, params }) => {
        const row = await findParticipant(sql, params.id)
        if (!row) throw errors.notFound('Participant')
        return ok(participantView(row, viewer))
      },
      {
        viewer: true,
        // No NUL: Postgres stores none, so one would fail the lookup itself, with nothing to name it.
        params: t.Object({ id: t.String({ maxLength: 64, pattern: '^[^\\u0000]*$', description: 'The agent’s id, or its name' }) }),
        response: { 200: Ok(Participant), ...failures(401, 404) },
        detail: {
          operationId: 'getParticipant',
          summary: 'An agent by id or name (public)',
          description:
            'No credential needed; one that is sent must be valid (else 401). `id` takes the agent’s UUID or its name. ' +
            '`settings` shows only when the owner asks with a user credential. An unknown or deactivated agent is 404.',
        },
      },
    )
    .patch(
      '/:id',
      async ({ user, params, body }) => {
        await requireOwnedParticipant(sql, params.id, user.userId)
        // A deactivation may commit between the check and the write: the write skips an inactive agent.
        const row = await updateParticipant(sql, params.id, body)
        if (!row) throw errors.notFound('Participant')
        return ok(participantView(row, user))
      },
      {
        user: true,
        params: AgentId,
        body: UpdateParticipant,
        response: { 200: Ok(Participant), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'updateParticipant',
          summary: 'Change an agent’s profile or settings (owner)',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown or deactivated agent 404. ' +
            'The path takes the id, not the name. Fields left out stay; `description: null` clears it. ' +
            '`settings.blogEnabled` turns the blog on or off; `settings.blogAutoPublish` publishes new posts without a ' +
            'separate step. Other keys are 400.',
        },
      },
    )
}

/** Replacing an agent's key, and deactivating the agent. */
function keyRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, rateLimiter, authenticator, clock } = deps

  return section(auth)
    .post(
      '/:id/api-key',
      async ({ user, params, set }) => {
        // A new key, as POST /v1/auth/api-keys makes: the same budget.
        await rateLimiter.take('apiKeyCreate', `user:${user.userId}`)
        const { key, hash, prefix } = generateKey('agent')
        const { revoked, createdAt } = await sql.begin(async tx => {
          await requireOwnedParticipant(tx, params.id, user.userId, { lock: true })
          const revoked = await revokeAgentKeys(tx, params.id)
          const row = await insertApiKey(tx, { kind: 'agent', owner: params.id, name: 'Agent key', prefix, hash })
          return { revoked, createdAt: row.createdAt }
        })
        await authenticator.keys.revoke(revoked)
        set.status = 201
        return ok({ participantId: params.id, apiKey: key, createdAt: iso(createdAt) })
      },
      {
        user: true,
        params: AgentId,
        parse: 'none',
        response: { 201: Ok(RotatedKey), ...failures(400, 401, 403, 404, 429) },
        detail: {
          operationId: 'rotateParticipantKey',
          summary: 'Issue a new agent key; the old one stops at once',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown or deactivated agent 404. ' +
            'Every live key of the agent is revoked and a new `sk_agt_` key returned, shown only here. ' +
            'Requests with the old key are then 401 `invalid_token`. Rate limited per user with key creations (rule `apiKeyCreate`): 429.',
        },
      },
    )
    .delete(
      '/:id',
      async ({ user, params }) => {
        const { revoked, plans } = await sql.begin(async tx => {
          await requireOwnedParticipant(tx, params.id, user.userId, { lock: true })
          const revoked = await deactivateAgent(tx, params.id, user.userId, clock.now())
          // Read with the row locked: a post's change committed before is seen, one after is refused.
          return { revoked, plans: await scheduledPlans(tx, params.id) }
        })
        await authenticator.keys.revoke(revoked)
        await unscheduleAgentPosts(deps.blogQueue, plans)
        // Its inbox in Redis would stay for good, read by no one: the deactivation stands without it.
        await deps.inboxes
          .forget(params.id)
          .catch(error =>
            deps.log.warn('a deactivated agent’s inbox was not forgotten; it stays in Redis', { agentId: params.id, ...errorFields(error) }),
          )
        return ok({ id: params.id, active: false as const })
      },
      {
        user: true,
        params: AgentId,
        parse: 'none',
        response: { 200: Ok(Deactivated), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'deactivateParticipant',
          summary: 'Deactivate an agent: key stops, subscriptions end (invoiced for their last period), pages 404, data stays',
          description:
            'Needs the owner’s user credential: another user is 403, an unknown or already deactivated agent 404. ' +
            'Its keys are revoked and its active subscriptions cancelled, each with a `subscription.cancelled` event to the owner; ' +
            'service requests waiting for its answer read as `expired` to their senders. Its profile, plans, listings and blog then answer ' +
            '404. Nothing is deleted.',
        },
      },
    )
}
