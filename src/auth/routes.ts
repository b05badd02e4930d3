/** /v1/auth: profile, user API keys, the device flow and SSE tokens. */
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'
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

export function authRoutes(deps: Deps, auth: AuthPlugin) {
  const { sql, rateLimiter, authenticator } = deps
  const device = { ...deps, siteUrl: deps.config.siteUrl }
  const clientIp = clientIpResolver(deps.config.trustedProxies)

  const me = async (userId: string) => {
    const user = await getUser(sql, userId)
    if (!user) throw errors.invalidToken()
    return user
  }

  return new Elysia({ prefix: '/v1/auth', tags: ['auth'] })
    .use(auth)
    .get('/me', async ({ user }) => ok(profile(await me(user.userId))), {
      user: true,
      response: { 200: Ok(UserProfile), ...failures(401, 403) },
      detail: { operationId: 'getProfile', summary: 'The caller’s profile' },
    })
    .patch(
      '/me',
      async ({ user, body }) => {
        const walletAddress = body.walletAddress === null ? null : checksumAddress(body.walletAddress)
        if (body.walletAddress !== null && !walletAddress) {
          throw errors.field('/walletAddress', 'must be 0x and 40 hex digits with a valid EIP-55 checksum')
        }
        await setWalletAddress(sql, user.userId, walletAddress)
        return ok(profile(await me(user.userId)))
      },
      {
        user: true,
        body: UpdateProfile,
        response: { 200: Ok(UserProfile), ...failures(400, 401, 403) },
        detail: { operationId: 'updateProfile', summary: 'Set (or, with null, clear) the wallet address' },
      },
    )
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
        detail: { operationId: 'createApiKey', summary: 'Create a user API key (shown once)' },
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
        detail: { operationId: 'listApiKeys', summary: 'The caller’s live API keys' },
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
        response: { 200: Ok(RevokedApiKey), ...failures(400, 401, 403, 404) },
        detail: { operationId: 'revokeApiKey', summary: 'Revoke a key; it stops working at once' },
      },
    )
    .post(
      '/device-codes',
      async ({ request, server, set }) => {
        await rateLimiter.take('deviceCodeCreate', `ip:${addressBucket(clientIp(server, request))}`)
        set.status = 201
        return ok(await startDeviceAuthorization(device))
      },
      {
        response: { 201: Ok(DeviceAuthorization), ...failures(429) },
        detail: {
          operationId: 'startDeviceAuthorization',
          summary: 'Start a device authorization (no credential)',
          security: [],
        },
      },
    )
    .get(
      '/device-codes/:code',
      async ({ params, request, server }) => {
        // Per address, as there is no credential: the caller's budget, whatever code it names.
        await rateLimiter.take('deviceCodePoll', `ip:${addressBucket(clientIp(server, request))}`)
        return ok(await pollDeviceAuthorization(device, params.code))
      },
      {
        params: t.Object({ code: t.String({ maxLength: 64, description: 'The device code (deviceCode) the flow started with' }) }),
        response: { 200: Ok(DevicePoll), ...failures(404, 429) },
        detail: {
          operationId: 'pollDeviceAuthorization',
          summary: 'Poll a device authorization; an approval is delivered once, then the code is spent',
          security: [],
        },
      },
    )
    .patch(
      '/device-codes/:code',
      async ({ user, params, body }) => {
        const subject = `user:${user.userId}`
        await rateLimiter.take('deviceCodeApprove', subject)
        // Every guess is charged a miss before it is looked at (atomically, so guesses sent at once
        // cannot all pass a check made before any was charged); a hit is given it back.
        await rateLimiter.take('deviceCodeMisses', subject)
        const status = await decideDeviceAuthorization(device, user.userId, params.code, body?.action ?? 'approve')
        if (!status) throw errors.notFound('User code')
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
        },
      },
    )
    .post(
      '/sse-token',
      async ({ user, request }) => ok({ token: await issueSseToken(deps, user.userId, userKeyHash(request.headers)), expiresIn: sseTokenTtlSeconds }),
      {
        user: true,
        response: { 200: Ok(SseToken), ...failures(401, 403) },
        detail: {
          operationId: 'issueSseToken',
          summary: 'A one-use token for opening /v1/events/stream?token=...',
        },
      },
    )
}
