/** Wire schemas of the identity endpoints. */
import { t } from 'elysia'
import { Int, NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

/** A wallet address's shape, as the users table's check has it; the EIP-55 checksum is checked in code (wallet.ts). */
const walletAddressPattern = '^0x[0-9a-fA-F]{40}$'

export const UserProfile = t.Object(
  {
    id: Uuid,
    providerId: t.String(),
    email: t.Union([t.String(), t.Null()]),
    walletAddress: t.Union([t.String({ pattern: walletAddressPattern }), t.Null()], { description: 'EIP-55 checksummed; null until set' }),
    createdAt: Timestamp,
  },
  {
    $id: 'UserProfile',
    description: 'The signed-in user',
    examples: [
      {
        id: '5f2d9c1e-8b4a-4e3f-a1d2-7c6b5a4e3d21',
        providerId: 'auth0|64f1c2',
        email: 'ada@example.com',
        walletAddress: null,
        createdAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)

export const UpdateProfile = t.Object(
  {
    walletAddress: t.Union([
      t.String({ pattern: walletAddressPattern, description: '0x and 40 hex digits; EIP-55 checksum checked when mixed case' }),
      t.Null(),
    ]),
  },
  { $id: 'UpdateProfile', description: 'The wallet address to set, or null to clear it', additionalProperties: false },
)

export const CreateApiKey = t.Object(
  { name: t.String({ minLength: 1, maxLength: 100 }) },
  { $id: 'CreateApiKey', description: 'A name to tell the key by', additionalProperties: false },
)
export const CreatedApiKey = t.Object(
  {
    id: Uuid,
    name: t.String(),
    key: t.String({ description: 'sk_usr_...; shown this once' }),
    createdAt: Timestamp,
  },
  { $id: 'CreatedApiKey', description: 'A new user key (sk_usr_...), shown this once' },
)
export const ApiKeySummary = t.Object(
  {
    id: Uuid,
    name: t.String(),
    prefix: t.String({ description: 'The first 12 characters of the key' }),
    createdAt: Timestamp,
    lastUsedAt: NullableTimestamp,
  },
  { $id: 'ApiKey', description: 'A live user key, without the key itself' },
)
export const RevokedApiKey = t.Object({ id: Uuid, revoked: t.Literal(true) }, { $id: 'RevokedApiKey', description: 'The key has stopped working' })

export const DeviceAuthorization = t.Object(
  {
    deviceCode: Uuid,
    userCode: t.String({ pattern: '^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$' }),
    verificationUri: t.String(),
    verificationUriComplete: t.String(),
    expiresIn: Int({ description: 'Seconds' }),
    interval: Int({ description: 'Seconds to wait between polls' }),
  },
  {
    $id: 'DeviceAuthorization',
    description: 'A started device authorization: poll with deviceCode, show userCode and verificationUri to the user',
    examples: [
      {
        deviceCode: '3c9e1f4a-2b7d-4e8f-9a6c-1d2e3f4a5b6c',
        userCode: 'BCDF-GHJK',
        verificationUri: 'https://marketplace.example.com/device',
        verificationUriComplete: 'https://marketplace.example.com/device?user_code=BCDF-GHJK',
        expiresIn: 900,
        interval: 5,
      },
    ],
  },
)

export const DevicePoll = t.Union(
  [
    t.Object({ status: t.Union([t.Literal('pending'), t.Literal('denied'), t.Literal('expired')]) }),
    t.Object({
      status: t.Literal('approved'),
      apiKey: t.String({ description: 'sk_usr_...; delivered once, then the device code is spent' }),
      user: t.Object({ id: Uuid, email: t.Union([t.String(), t.Null()]) }),
    }),
  ],
  { $id: 'DevicePoll', description: 'Where a device authorization stands; `approved` carries the user key, once' },
)

// MaybeEmpty, not t.Optional: Elysia skips checking a primitive body against an optional schema,
// so a body of "deny" would pass, be read as no action, and approve.
export const DeviceDecision = t.MaybeEmpty(
  t.Object(
    { action: t.Optional(t.Union([t.Literal('approve'), t.Literal('deny')])) },
    { $id: 'DeviceDecision', description: 'Approve (the default, also with no body) or deny', additionalProperties: false },
  ),
)
export const DeviceDecided = t.Object(
  { status: t.Union([t.Literal('approved'), t.Literal('denied')]) },
  { $id: 'DeviceDecided', description: 'What was decided' },
)

export const SseToken = t.Object(
  {
    token: Uuid,
    expiresIn: Int({ description: 'Seconds; the token opens one stream' }),
  },
  { $id: 'SseToken', description: 'A one-use token for /v1/events/stream?token=...' },
)
