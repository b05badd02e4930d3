/** Shared knowledge: the user controls their organization's context (/v1/context); agents use it through the agent API. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Log } from '../log.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { Dispatcher } from '../actors/dispatcher.ts'
import { errors } from '../errors.ts'
import { failures, Ok, ok, Query } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import type { RevertEntry } from './commands.ts'
import { checkSizes, writeEntry } from './entries.ts'
import { ContextEntries, ContextEntry, ContextKey, ContextTypeParam, Revert, UserWrite, userSourceMethod } from './schema.ts'
import { entryVersions, findOrganization, newestEntries } from './store.ts'

const EntryPath = t.Object({ type: ContextTypeParam, key: ContextKey })

/** What the context routes use; clock and log for idempotent commands. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  log: Log
  rateLimiter: RateLimiter
  dispatcher: Dispatcher
}

export function contextRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { sql, dispatcher, rateLimiter } = deps

  return new Elysia({ tags: ['context'] })
    .use(auth)
    .get(
      '/v1/context',
      async ({ user, query }) => {
        const orgId = await findOrganization(sql, user.userId)
        return ok({ entries: orgId ? await newestEntries(sql, orgId, query) : [] })
      },
      {
        user: true,
        query: Query({ type: t.Optional(ContextTypeParam), key: t.Optional(ContextKey) }),
        response: { 200: Ok(ContextEntries), ...failures(400, 401, 403) },
        detail: {
          operationId: 'readContext',
          summary: 'Your organization’s entries, newest version of each',
          description:
            'Needs a user credential. `type` (an unknown one is 400) and `key` narrow the list; ' +
            'entries are ordered by type, then key. Each entry names its `author`: the user or an agent. ' +
            'Before the first write there are none.',
        },
      },
    )
    .get(
      '/v1/context/:type/:key/versions',
      async ({ user, params }) => {
        const orgId = await findOrganization(sql, user.userId)
        const versions = orgId ? await entryVersions(sql, orgId, params.type, params.key) : []
        if (versions.length === 0) throw errors.notFound('Context entry')
        return ok({ entries: versions })
      },
      {
        user: true,
        params: EntryPath,
        response: { 200: Ok(ContextEntries), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'listContextVersions',
          summary: 'Every version of an entry, newest first',
          description:
            'Needs a user credential. All versions of one entry, not paged, each with its `confidence`, `source` and ' +
            '`author`. An entry never written is 404. POST /v1/context/{type}/{key}/revert brings an earlier version back.',
        },
      },
    )
    .put(
      '/v1/context/:type/:key',
      async ({ user, params, body, headers, set }) => {
        checkSizes(body.data)
        const path = `/v1/context/${params.type}/${params.key}`
        const request = { subject: principalSubject(user), key: headers['idempotency-key'], method: 'PUT', path, body }
        const outcome = await idempotentCommand(deps, request, async identity => {
          await rateLimiter.take('contextWrite', principalSubject(user))
          const write = { type: params.type, key: params.key, data: body.data, confidence: 'user_provided' as const }
          const by = { source: { method: userSourceMethod }, author: { kind: 'user' as const, id: user.userId } }
          return { status: 200, body: ok(await writeEntry(deps, user.userId, { ...write, ...by }, identity)) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof ContextEntry.static }
      },
      {
        user: true,
        params: EntryPath,
        body: UserWrite,
        headers: IdempotencyHeaders,
        response: { 200: Ok(ContextEntry), ...failures(400, 401, 403, 409, 429, 503) },
        detail: {
          operationId: 'writeContext',
          summary: 'Set an entry yourself: a new user_provided version, which agents cannot override (honours Idempotency-Key)',
          description:
            'Needs a user credential; the organization is made on the first write. The version’s `source.method` is `user`. ' +
            'Agents’ writes to the entry are then 409 `user_provided_precedence` until a newer version is not `user_provided` ' +
            '(a revert). Answers 200. On 503, retry with the same `Idempotency-Key`: one version is made. Rate limited per user (rule `contextWrite`; an agent has its own): 429.',
        },
      },
    )
    .post(
      '/v1/context/:type/:key/revert',
      async ({ user, params, body, headers, set }) => {
        const path = `/v1/context/${params.type}/${params.key}/revert`
        const request = { subject: principalSubject(user), key: headers['idempotency-key'], method: 'POST', path, body }
        const outcome = await idempotentCommand(deps, request, async identity => {
          await rateLimiter.take('contextWrite', principalSubject(user))
          const orgId = await findOrganization(sql, user.userId)
          if (!orgId) throw errors.notFound('Context entry')
          const command: RevertEntry = { type: params.type, key: params.key, version: body.version, userId: user.userId }
          const entry = accepted(await dispatcher.ask<ContextEntry | Refusal>(`org:${orgId}`, 'context.revert', command, identity), () =>
            errors.notFound('Context entry version'),
          )
          return { status: 201, body: ok(entry) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof ContextEntry.static }
      },
      {
        user: true,
        params: EntryPath,
        body: Revert,
        headers: IdempotencyHeaders,
        response: { 201: Ok(ContextEntry), ...failures(400, 401, 403, 404, 409, 429, 503) },
        detail: {
          operationId: 'revertContext',
          summary: 'A new version with an earlier version’s data and confidence (source.method revert:v<N>; honours Idempotency-Key)',
          description:
            'Needs a user credential. `version` names an earlier version of this entry; an unknown one is 404. ' +
            'Nothing is removed: the revert becomes the newest version. Reverting to an agent’s version lets agents write the ' +
            'entry again. On 503, retry with the same `Idempotency-Key`: one version is made. Rate limited per user (rule `contextWrite`; an agent has its own): 429.',
        },
      },
    )
}
