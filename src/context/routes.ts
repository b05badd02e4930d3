/** Shared knowledge: agents read and extend a subscriber's context (/v1/agent/context); the user controls it (/v1/context). */
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'
import { errors } from '../errors.ts'
import { failures, Ok, ok, Query, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import { hasActiveSubscription } from '../billing/subscriptions/store.ts'
import type { RevertEntry, WriteEntry } from './commands.ts'
import { AgentWrite, ContextEntry, ContextKey, ContextTypeParam, Revert, UserWrite } from './schema.ts'
import { ensureOrganization, entryVersions, findOrganization, newestEntries } from './store.ts'

const maxDataBytes = 64 * 1024
const maxSourceBytes = 4 * 1024

function checkSizes(data: unknown, source?: unknown) {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) throw errors.field('/data', 'must be a JSON object')
  if (storedBytes(data) > maxDataBytes) throw errors.field('/data', 'must be at most 64 KiB')
  if (source !== undefined && storedBytes(source) > maxSourceBytes) throw errors.field('/source', 'must be at most 4 KiB')
}

/**
 * The size of a JSON value as Postgres stores it: its numbers written out in full, as jsonb keeps
 * them (`1e300` is 301 digits there, 5 characters in JSON). Bodies nest at most 64 deep.
 */
function storedBytes(value: unknown): number {
  let bytes = Buffer.byteLength(JSON.stringify(value))
  const stack = [value]
  while (stack.length > 0) {
    const item = stack.pop()
    if (typeof item === 'number') bytes += fullLength(item) - JSON.stringify(item).length
    else if (item !== null && typeof item === 'object') for (const child of Object.values(item)) stack.push(child)
  }
  return bytes
}

/** The length of a finite number written with no exponent (`1.5e-7` is `0.00000015`). */
function fullLength(n: number): number {
  const short = String(Math.abs(n))
  const sign = n < 0 ? 1 : 0
  const e = short.indexOf('e')
  if (e === -1) return sign + short.length
  const mantissa = short.slice(0, e)
  const exponent = Number(short.slice(e + 1))
  const dot = mantissa.indexOf('.')
  const digits = dot === -1 ? mantissa.length : mantissa.length - 1
  const point = (dot === -1 ? mantissa.length : dot) + exponent
  if (point >= digits) return sign + point
  if (point <= 0) return sign + 2 - point + digits
  return sign + digits + 1
}

const Entries = t.Object({ entries: t.Array(ContextEntry) })
const EntryPath = t.Object({ type: ContextTypeParam, key: ContextKey })

export function contextRoutes(deps: Deps, auth: AuthPlugin) {
  const { sql, dispatcher, clock } = deps

  const write = async (userId: string, command: WriteEntry) => {
    const orgId = await ensureOrganization(sql, userId, clock.now())
    return accepted(await dispatcher.ask<ContextEntry | Refusal>(`org:${orgId}`, 'context.write', command))
  }

  return new Elysia({ tags: ['context'] })
    .use(auth)
    .get(
      '/v1/agent/context',
      async ({ agent, query }) => {
        if (!(await hasActiveSubscription(sql, query.userId, agent.participantId))) throw errors.notSubscribed()
        const orgId = await findOrganization(sql, query.userId)
        return ok({ entries: orgId ? await newestEntries(sql, orgId, query) : [] })
      },
      {
        agent: true,
        query: Query({ userId: Uuid, type: t.Optional(ContextTypeParam), key: t.Optional(ContextKey) }),
        response: { 200: Ok(Entries), ...failures(400, 401, 403) },
        detail: {
          operationId: 'readContextAsAgent',
          summary: 'The newest version of each matching entry of a subscriber’s organization, by type then key',
        },
      },
    )
    .post(
      '/v1/agent/context',
      async ({ agent, body, set }) => {
        checkSizes(body.data, body.source)
        if (body.confidence === 'user_provided') throw errors.confidenceNotAllowed()
        if (!(await hasActiveSubscription(sql, body.userId, agent.participantId))) throw errors.notSubscribed()
        const entry = await write(body.userId, {
          type: body.type,
          key: body.key,
          data: body.data,
          confidence: body.confidence ?? 'suggested',
          source: body.source ?? null,
          author: { kind: 'agent', id: agent.participantId },
        })
        set.status = 201
        return ok(entry)
      },
      {
        agent: true,
        body: AgentWrite,
        response: { 201: Ok(ContextEntry), ...failures(400, 401, 403, 409, 503) },
        detail: {
          operationId: 'writeContextAsAgent',
          summary: 'A new version of an entry (derived or suggested); 409 while the user’s own value stands',
        },
      },
    )
    .get(
      '/v1/context',
      async ({ user, query }) => {
        const orgId = await findOrganization(sql, user.userId)
        return ok({ entries: orgId ? await newestEntries(sql, orgId, query) : [] })
      },
      {
        user: true,
        query: Query({ type: t.Optional(ContextTypeParam), key: t.Optional(ContextKey) }),
        response: { 200: Ok(Entries), ...failures(400, 401, 403) },
        detail: { operationId: 'readContext', summary: 'Your organization’s entries, newest version of each' },
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
        response: { 200: Ok(Entries), ...failures(400, 401, 403, 404) },
        detail: { operationId: 'listContextVersions', summary: 'Every version of an entry, newest first' },
      },
    )
    .put(
      '/v1/context/:type/:key',
      async ({ user, params, body }) => {
        checkSizes(body.data)
        return ok(
          await write(user.userId, {
            type: params.type,
            key: params.key,
            data: body.data,
            confidence: 'user_provided',
            source: { method: 'user' },
            author: { kind: 'user', id: user.userId },
          }),
        )
      },
      {
        user: true,
        params: EntryPath,
        body: UserWrite,
        response: { 200: Ok(ContextEntry), ...failures(400, 401, 403, 503) },
        detail: {
          operationId: 'writeContext',
          summary: 'Set an entry yourself: a new user_provided version, which agents cannot override',
        },
      },
    )
    .post(
      '/v1/context/:type/:key/revert',
      async ({ user, params, body, set }) => {
        const orgId = await findOrganization(sql, user.userId)
        if (!orgId) throw errors.notFound('Context entry')
        const command: RevertEntry = { type: params.type, key: params.key, version: body.version, userId: user.userId }
        const entry = accepted(
          await dispatcher.ask<ContextEntry | Refusal>(`org:${orgId}`, 'context.revert', command),
          () => errors.notFound('Context entry version'),
        )
        set.status = 201
        return ok(entry)
      },
      {
        user: true,
        params: EntryPath,
        body: Revert,
        response: { 201: Ok(ContextEntry), ...failures(400, 401, 403, 404, 503) },
        detail: {
          operationId: 'revertContext',
          summary: 'A new version with an earlier version’s data and confidence (source.method revert:v<N>)',
        },
      },
    )
}
