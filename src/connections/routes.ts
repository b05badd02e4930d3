/** /v1/connections: a user's connected accounts, which agents act on through proxy calls. */
import { randomUUID } from 'node:crypto'
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Config } from '../config.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import { errors } from '../errors.ts'
import { Ok, failures, iso, ok, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { refusalMessages, upstreamRefusal } from './address-policy.ts'
import { sealCredential } from './credential-box.ts'
import { Connection, CreateConnection, DeletedConnection } from './schema.ts'
import { deleteConnection, insertConnection, listConnections, type ConnectionRow } from './store.ts'

const connectionView = (row: ConnectionRow) => ({
  id: row.id,
  provider: row.provider,
  baseUrl: row.baseUrl,
  label: row.label,
  createdAt: iso(row.createdAt),
})

/** What the connection routes use. */
export interface RouteDeps {
  sql: Sql
  clock: Clock
  config: Config
  rateLimiter: RateLimiter
}

export function connectionRoutes({ sql, config, clock, rateLimiter }: RouteDeps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/connections', tags: ['connections'] })
    .use(auth)
    .post(
      '',
      async ({ user, body, set }) => {
        // Before the address's DNS lookup, which a refused request costs too.
        await rateLimiter.take('connectionCreate', `user:${user.userId}`)
        let url: URL
        try {
          url = new URL(body.baseUrl)
        } catch {
          throw errors.field('/baseUrl', 'must be an absolute URL')
        }
        const baseUrl = url.toString().replace(/\/+$/, '')
        if (baseUrl.length > 2048) throw errors.field('/baseUrl', 'must be at most 2048 characters once encoded')
        const refusal = await upstreamRefusal(url, config.proxyAllowedHosts)
        if (refusal) throw errors.field('/baseUrl', refusalMessages[refusal])
        const id = randomUUID()
        const row = await insertConnection(sql, {
          id,
          userId: user.userId,
          provider: body.provider,
          baseUrl,
          label: body.label ?? null,
          credential: sealCredential(config.connectionsKey!, body.credential, id),
          at: clock.now(),
        })
        if (!row) throw errors.providerTaken()
        set.status = 201
        return ok(connectionView(row))
      },
      {
        user: true,
        body: CreateConnection,
        response: { 201: Ok(Connection), ...failures(400, 401, 403, 409, 429) },
        detail: {
          operationId: 'createConnection',
          summary: 'Connect an account; the credential is stored encrypted',
          description:
            'Needs a user credential. One connection per `provider`: a second is 409 `name_taken` (delete the first). ' +
            '`baseUrl` must be https and must not resolve to a private, loopback or link-local address (400); a host in ' +
            '`PROXY_ALLOWED_HOSTS` is exempt from both. A query in `baseUrl` is sent with every call, before the call’s own. The user’s agents use it through POST /v1/agent/proxy-call. Rate limited per user (rule `connectionCreate`): 429.',
        },
      },
    )
    .get('', async ({ user }) => ok((await listConnections(sql, user.userId)).map(connectionView)), {
      user: true,
      response: { 200: Ok(t.Array(Connection)), ...failures(401, 403) },
      detail: {
        operationId: 'listConnections',
        summary: 'Your connected accounts (credentials never shown)',
        description:
          'Needs a user credential. Oldest first, not paged. Agents name a connection by its `provider` in POST ' + '/v1/agent/proxy-call.',
      },
    })
    .delete(
      '/:id',
      async ({ user, params }) => {
        if (!(await deleteConnection(sql, user.userId, params.id))) throw errors.notFound('Connection')
        return ok({ id: params.id, deleted: true as const })
      },
      {
        user: true,
        params: t.Object({ id: Uuid }),
        parse: 'none',
        response: { 200: Ok(DeletedConnection), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'deleteConnection',
          summary: 'Remove a connection and its credential',
          description:
            'Needs a user credential; another user’s connection is 404. Agents’ proxy calls for its provider are then 404 ' +
            '`connection_not_found`.',
        },
      },
    )
}
