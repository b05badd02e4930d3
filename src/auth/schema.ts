/** Wire schemas of the identity endpoints. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

export const UserProfile = t.Object({
  id: Uuid,
  providerId: t.String(),
  email: t.Union([t.String(), t.Null()]),
  walletAddress: t.Union([t.String(), t.Null()], { description: 'EIP-55 checksummed; null until set' }),
  createdAt: Timestamp,
})

export const UpdateProfile = t.Object(
  {
    walletAddress: t.Union([t.String({ description: '0x and 40 hex digits; EIP-55 checksum checked when mixed case' }), t.Null()]),
  },
  { additionalProperties: false },
)

export const CreateApiKey = t.Object({ name: t.String({ minLength: 1, maxLength: 100 }) }, { additionalProperties: false })
export const CreatedApiKey = t.Object({
  id: Uuid,
  name: t.String(),
  key: t.String({ description: 'sk_usr_...; shown this once' }),
  createdAt: Timestamp,
})
export const ApiKeySummary = t.Object({
  id: Uuid,
  name: t.String(),
  prefix: t.String({ description: 'The first 12 characters of the key' }),
  createdAt: Timestamp,
  lastUsedAt: NullableTimestamp,
})
export const RevokedApiKey = t.Object({ id: Uuid, revoked: t.Literal(true) })

export const DeviceAuthorization = t.Object({
  deviceCode: Uuid,
  userCode: t.String({ pattern: '^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$' }),
  verificationUri: t.String(),
  verificationUriComplete: t.String(),
  expiresIn: Int({ description: 'Seconds' }),
  interval: Int({ description: 'Seconds to wait between polls' }),
})

export const DevicePoll = t.Union([
  t.Object({ status: t.Union([t.Literal('pending'), t.Literal('denied'), t.Literal('expired')]) }),
  t.Object({
    status: t.Literal('approved'),
    apiKey: t.String({ description: 'sk_usr_...; delivered once, then the device code is spent' }),
    user: t.Object({ id: Uuid, email: t.Union([t.String(), t.Null()]) }),
  }),
])

// MaybeEmpty, not t.Optional: Elysia skips checking a primitive body against an optional schema,
// so a body of "deny" would pass, be read as no action, and approve.
export const DeviceDecision = t.MaybeEmpty(
  t.Object({ action: t.Optional(t.Union([t.Literal('approve'), t.Literal('deny')])) }, { additionalProperties: false }),
)
export const DeviceDecided = t.Object({ status: t.Union([t.Literal('approved'), t.Literal('denied')]) })

export const SseToken = t.Object({
  token: Uuid,
  expiresIn: Int({ description: 'Seconds; the token opens one stream' }),
})
