/** /v1/auth: profile, user API keys, the device flow and SSE tokens. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { Config } from '../config.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { Authenticator } from './authenticator.ts'
import { errors } from '../errors.ts'
import { Ok, failures, iso, isoOrNull, ok, Uuid } from '../http/schema.ts'
import { addressBucket, clientIpResolver } from '../http/client-ip.ts'
import type { AuthPlugin } from './plugin.ts'
import { generateKey } from './api-key.ts'
import { checksumAddress } from './wallet.ts'
import { getUser, insertApiKey, listUserKeys, revokeUserKey, setWalletAddress, type UserRow } from './store.ts'
import { decideDeviceAuthorization, pollDeviceAuthorization, startDeviceAuthorization } from './device-flow.ts'
import { issueSseToken, sseTokenTtlSeconds } from './sse-token.ts'
import { userKeyHash } from './authenticator.ts'
import {
  ApiKeySummary,
  CreateApiKey,
  CreatedApiKey,
  DeviceAuthorization,
  DeviceDecided,
  DeviceDecision,
  DevicePoll,
  RevokedApiKey,
  SseToken,
  UpdateProfile,
  UserProfile,
} from './schema.ts'

const profile = (user: UserRow) => ({
  id: user.id,
  providerId: user.providerId,
  email: user.email,
  walletAddress: user.walletAddress,
  createdAt: iso(user.createdAt),
})

/** What the auth routes use; Redis, keys and clock for the device flow and SSE tokens. */
export interface RouteDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  clock: Clock
  config: Config
  rateLimiter: RateLimiter
  authenticator: Authenticator
}

export function authRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return new Elysia().use(profileRoutes(deps, auth)).use(apiKeyRoutes(deps, auth)).use(deviceRoutes(deps, auth)).use(sseTokenRoutes(deps, auth))
}

const section = (auth: AuthPlugin) => new Elysia({ prefix: '/v1/auth', tags: ['auth'] }).use(auth)

function profileRoutes({ sql }: RouteDeps, auth: AuthPlugin) {
  const me = async (userId: string) => {
    const user = await getUser(sql, userId)
    if (!user) throw errors.invalidToken()
    return user
  }

  return section(auth)
    .get('/me', async ({ user }) => ok(profile(await me(user.userId))), {
      user: true,
      response: { 200: Ok(UserProfile), ...failures(401, 403) },
      detail: {
        operationId: 'getProfile',
        summary: 'The caller’s profile',
        description:
          'Needs a user credential: a bearer JWT or a `sk_usr_` key; an agent key is 403. ' +
          'The first valid JWT of a new subject creates the user, here or on any other endpoint. ' +
          '`walletAddress` is null until set with PATCH /v1/auth/me.',
      },
    })
    .patch(
      '/me',
      async ({ user, body }) => {
        const walletAddress = body.walletAddress === null ? null : checksumAddress(body.walletAddress)
        if (body.walletAddress !== null && !walletAddress) {
          throw errors.field('/walletAddress', 'must be 0x and 40 hex digits with a valid EIP-55 checksum')
        }
        // The row this update wrote: read again after it, the profile could be a concurrent update's.
        const updated = await setWalletAddress(sql, user.userId, walletAddress)
        if (!updated) throw errors.invalidToken()
        return ok(profile(updated))
      },
      {
        user: true,
        body: UpdateProfile,
        response: { 200: Ok(UserProfile), ...failures(400, 401, 403) },
        detail: {
          operationId: 'updateProfile',
          summary: 'Set (or, with null, clear) the wallet address',
          description:
            'Needs a user credential (bearer JWT or `sk_usr_` key); an agent key is 403. ' +
            'The address is `0x` and 40 hex digits; mixed case must carry a valid EIP-55 checksum, else 400. ' +
            'It is stored and returned in checksummed form. Answers the whole profile.',
        },
      },
    )
}

function apiKeyRoutes({ sql, rateLimiter, authenticator }: RouteDeps, auth: AuthPlugin) {
  return section(auth)
    .post(
      '/api-keys',
      async ({ user, body, set }) => {
        await rateLimiter.take('apiKeyCreate', `user:${user.userId}`)
        const { key, hash, prefix } = generateKey('user')
        const row = await insertApiKey(sql, { kind: 'user', owner: user.userId, name: body.name, prefix, hash })
        set.status = 201
        return ok({ id: row.id, name: row.name, key, createdAt: iso(row.createdAt) })
      },
      {
        user: true,
        body: CreateApiKey,
        response: { 201: Ok(CreatedApiKey), ...failures(400, 401, 403, 429) },
        detail: {
          operationId: 'createApiKey',
          summary: 'Create a user API key (shown once)',
          description:
            'Needs a user credential; an agent key is 403. The key (`sk_usr_...`) acts as the caller and is in this response ' +
            'only: the service keeps its hash, not the key. Creations are rate limited per user (rule `apiKeyCreate`): 429 ' +
            'with `Retry-After`.',
        },
      },
    )
    .get(
      '/api-keys',
      async ({ user }) =>
        ok(
          (await listUserKeys(sql, user.userId)).map(row => ({
            id: row.id,
            name: row.name,
            prefix: row.prefix,
            createdAt: iso(row.createdAt),
            lastUsedAt: isoOrNull(row.lastUsedAt),
          })),
        ),
      {
        user: true,
        response: { 200: Ok(t.Array(ApiKeySummary)), ...failures(401, 403) },
        detail: {
          operationId: 'listApiKeys',
          summary: 'The caller’s live API keys',
          description:
            'Needs a user credential. Newest first, not paged; keys issued by the device flow are here too. ' +
            'Each shows its `prefix` (the first 12 characters), never the key. `lastUsedAt` is written in batches and may be ' +
            'up to about two minutes behind.',
        },
      },
    )
    .delete(
      '/api-keys/:id',
      async ({ user, params }) => {
        const hash = await revokeUserKey(sql, user.userId, params.id)
        if (!hash) throw errors.notFound('API key')
        await authenticator.keys.revoke([hash])
        return ok({ id: params.id, revoked: true as const })
      },
      {
        user: true,
        params: t.Object({ id: Uuid }),
        parse: 'none',
        response: { 200: Ok(RevokedApiKey), ...failures(400, 401, 403, 404) },
        detail: {
          operationId: 'revokeApiKey',
          summary: 'Revoke a key; it stops working at once',
          description:
            'Needs a user credential. Only the caller’s own user keys: another user’s key, an agent key or one already ' +
            'revoked is 404. Requests with the key are then 401 `invalid_token`, and event streams opened with it end.',
        },
      },
    )
}

function deviceRoutes(deps: RouteDeps, auth: AuthPlugin) {
  const { rateLimiter } = deps
  const device = { ...deps, siteUrl: deps.config.siteUrl }
  const clientIp = clientIpResolver(deps.config.trustedProxies)

  return section(auth)
    .post(
      '/device-codes',
      async ({ request, server, set }) => {
        await rateLimiter.take('deviceCodeCreate', `ip:${addressBucket(clientIp(server, request))}`)
        set.status = 201
        return ok(await startDeviceAuthorization(device))
      },
      {
        parse: 'none',
        response: { 201: Ok(DeviceAuthorization), ...failures(429) },
        detail: {
          operationId: 'startDeviceAuthorization',
          summary: 'Start a device authorization (no credential)',
          description:
            'No credential. Show the user `userCode` and `verificationUri` (or `verificationUriComplete`); ' +
            'they approve it with PATCH /v1/auth/device-codes/{code}. Poll GET /v1/auth/device-codes/{deviceCode} every ' +
            '`interval` seconds (5) until it is decided or `expiresIn` (900 s) passes. ' +
            'Rate limited per client IP (rule `deviceCodeCreate`).',
          security: [],
        },
      },
    )
    .get(
      '/device-codes/:code',
      async ({ params, request, server }) => {
        // Per address, as there is no credential: the caller's budget, whatever code it names.
        await rateLimiter.take('deviceCodePoll', `ip:${addressBucket(clientIp(server, request))}`)
        // HEAD is safe (RFC 9110, 9.2.1): it would spend the one delivery of the key on an answer
        // without a body. It says the code stands (200), or is unknown (404), as GET would.
        const result = await pollDeviceAuthorization(device, params.code, { deliver: request.method !== 'HEAD' })
        // (A body-less Response the route's typed answers do not list: `as never` lets it through.)
        if (result === null) return new Response(null, { status: 200 }) as never
        return ok(result)
      },
      {
        params: t.Object({ code: t.String({ maxLength: 64, description: 'The device code (deviceCode) the flow started with' }) }),
        response: { 200: Ok(DevicePoll), ...failures(404, 429) },
        detail: {
          operationId: 'pollDeviceAuthorization',
          summary: 'Poll a device authorization; an approval is delivered once, then the code is spent',
          description:
            'No credential. `status` is `pending`, `denied`, `expired`, or `approved` with a new user key (`sk_usr_...`) in ' +
            'this one answer; after it the code is 404 (a HEAD request delivers nothing and spends nothing). Polls of one code under 4 s apart are 429 `slow_down`: wait ' +
            '`interval` seconds. An unknown code is 404. Polls are also rate limited per client IP (rule `deviceCodePoll`).',
          security: [],
        },
      },
    )
    .patch(
      '/device-codes/:code',
      async ({ user, params, body }) => {
        const subject = `user:${user.userId}`
        const action = body?.action ?? 'approve'
        await rateLimiter.take('deviceCodeApprove', subject)
        // An approval gives the device a user key of this user: it costs the key's token, as a key
        // created here does, given back when nothing was approved.
        const keyToken = action === 'approve'
        if (keyToken) await rateLimiter.take('apiKeyCreate', subject)
        const giveKeyTokenBack = () => (keyToken ? rateLimiter.refund('apiKeyCreate', subject).catch(() => {}) : undefined)
        // Every guess is charged a miss before it is looked at (atomically, so guesses sent at once
        // cannot all pass a check made before any was charged); a hit is given it back.
        await rateLimiter.take('deviceCodeMisses', subject).catch(async (error: unknown) => {
          await giveKeyTokenBack()
          throw error
        })
        const status = await decideDeviceAuthorization(device, user.userId, params.code, action)
        if (!status) {
          await giveKeyTokenBack()
          throw errors.notFound('User code')
        }
        await rateLimiter.refund('deviceCodeMisses', subject)
        return ok({ status })
      },
      {
        user: true,
        params: t.Object({
          code: t.String({ maxLength: 16, description: 'The user code (userCode) the device shows, with or without its hyphen, in any case' }),
        }),
        body: DeviceDecision,
        response: { 200: Ok(DeviceDecided), ...failures(400, 401, 403, 404, 429) },
        detail: {
          operationId: 'decideDeviceAuthorization',
          summary: 'Approve (default) or deny a device by its user code',
          description:
            'Needs a user credential; the key the device then receives acts as this user. No body approves; ' +
            '`{"action": "deny"}` denies. An unknown or expired code, or one already decided otherwise, is 404; ' +
            'repeating one’s own decision is 200 until the device has collected its key. Misses are limited per user (rule ' +
            '`deviceCodeMisses`, by default 10 an hour), and ' +
            'decisions too (`deviceCodeApprove`); an approval, a repeat of one too, takes a token of `apiKeyCreate`, as ' +
            'creating a key does (given back on a miss): 429.',
        },
      },
    )
}

function sseTokenRoutes(deps: RouteDeps, auth: AuthPlugin) {
  return section(auth).post(
    '/sse-token',
    async ({ user, request }) => {
      await deps.rateLimiter.take('sseTokenCreate', `user:${user.userId}`)
      return ok({ token: await issueSseToken(deps, user.userId, userKeyHash(request.headers)), expiresIn: sseTokenTtlSeconds })
    },
    {
      user: true,
      parse: 'none',
      response: { 200: Ok(SseToken), ...failures(401, 403, 429) },
      detail: {
        operationId: 'issueSseToken',
        summary: 'A one-use token for opening /v1/events/stream?token=...',
        description:
          'Needs a user credential; an agent key is 403. Open the stream as `/v1/events/stream?token=...` where a client ' +
          'cannot send an Authorization header (a browser’s EventSource). The token opens one stream within `expiresIn` (60 ' +
          's), is spent by it, and is accepted nowhere else. Rate limited per user (rule `sseTokenCreate`): 429.',
      },
    },
  )
}
