/** The device authorization flow (after RFC 8628): start, poll, approve or deny. */
import { createHash, randomBytes, randomUUID } from 'node:crypto'
import type { Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { errors } from '../errors.ts'
import { isUuid } from '../http/formats.ts'
import { asciiUpperCase } from '../text.ts'
import { generateKey } from './api-key.ts'
import { decideDeviceCode, findDeviceCode, insertDeviceCode, markDelivered } from './device-store.ts'
import { getUser, insertApiKey } from './store.ts'

export const deviceCodeTtlSeconds = 900
export const pollIntervalSeconds = 5
// A poll sooner than this after the previous one is told to slow down (the advertised interval is 5 s).
const minPollGapMs = 4000
const userCodeAlphabet = 'BCDFGHJKLMNPQRSTVWXZ'

export type PollResult =
  { status: 'pending' | 'denied' | 'expired' } | { status: 'approved'; apiKey: string; user: { id: string; email: string | null } }

export interface DeviceFlowDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  clock: Clock
  siteUrl: string
}

export async function startDeviceAuthorization({ sql, clock, siteUrl }: DeviceFlowDeps) {
  const createdAt = clock.now()
  const expiresAt = new Date(createdAt.getTime() + deviceCodeTtlSeconds * 1000)
  for (let attempt = 0; attempt < 5; attempt++) {
    const code = randomUserCode()
    const deviceCode = randomUUID()
    if (!(await insertDeviceCode(sql, { codeHash: hashDeviceCode(deviceCode), userCode: code, createdAt, expiresAt }))) continue
    const userCode = `${code.slice(0, 4)}-${code.slice(4)}`
    return {
      deviceCode,
      userCode,
      verificationUri: `${siteUrl}/device`,
      verificationUriComplete: `${siteUrl}/device?user_code=${userCode}`,
      expiresIn: deviceCodeTtlSeconds,
      interval: pollIntervalSeconds,
    }
  }
  throw errors.unavailable('Could not allocate a user code; try again')
}

/**
 * `deliver: false` (a HEAD request, whose answer has no body): an approved code is answered null,
 * and neither mints the key nor spends the code, so that the key is not delivered to no one; nor is
 * it a poll that the next must wait the interval after (it tells only whether the code stands).
 */
export async function pollDeviceAuthorization(
  deps: DeviceFlowDeps,
  deviceCode: string,
  { deliver = true }: { deliver?: boolean } = {},
): Promise<PollResult | null> {
  const { sql, clock } = deps
  const code = deviceCode.toLowerCase()
  if (!isUuid(code)) throw errors.notFound('Device code')
  const now = clock.now()
  const codeHash = hashDeviceCode(code)
  // Read before anything is written: a poll of a code that does not exist (a guess) leaves no trace.
  const row = await findDeviceCode(sql, codeHash)
  if (!row || row.status === 'delivered') throw errors.notFound('Device code')
  if (deliver) await gatePoll(deps, codeHash, now)
  if (row.status === 'denied') return { status: 'denied' }
  // An approval is collected within the code's lifetime or not at all (RFC 8628 3.5, expired_token).
  if (row.expiresAt <= now) return { status: 'expired' }
  if (row.status === 'pending') return { status: 'pending' }
  if (!deliver) return null

  return sql.begin(async tx => {
    const userId = await markDelivered(tx, codeHash, now)
    if (!userId) throw errors.notFound('Device code')
    const { key, hash, prefix } = generateKey('user')
    const name = `Device authorization ${now.toISOString().slice(0, 10)}`
    await insertApiKey(tx, { kind: 'user', owner: userId, name, prefix, hash })
    const user = await getUser(tx, userId)
    return { status: 'approved' as const, apiKey: key, user: { id: userId, email: user?.email ?? null } }
  })
}

/** The decision when a pending, unexpired code was decided (or already was, the same way, by this user); null is a miss. */
export async function decideDeviceAuthorization(
  { sql, clock }: DeviceFlowDeps,
  userId: string,
  userCode: string,
  action: 'approve' | 'deny',
): Promise<'approved' | 'denied' | null> {
  const code = asciiUpperCase(userCode).replace(/-/g, '')
  if (!/^[BCDFGHJKLMNPQRSTVWXZ]{8}$/.test(code)) return null
  const status = action === 'approve' ? 'approved' : 'denied'
  const decided = await decideDeviceCode(sql, code, { status, userId, at: clock.now() })
  return decided ? status : null
}

/**
 * What a device code is stored and looked up by: its SHA-256, of the lower-case text the device holds.
 * The code itself, a bearer secret, is kept nowhere: not in Postgres, not in a Redis key's name.
 */
export function hashDeviceCode(deviceCode: string): Buffer {
  return createHash('sha256').update(deviceCode).digest()
}

/** Records this poll of an existing code; 429 `slow_down` when the previous one was under 4 s ago. */
async function gatePoll({ redis, keys }: DeviceFlowDeps, codeHash: Buffer, now: Date): Promise<void> {
  const previous = (await redis.call(
    'set',
    keys.devicePoll(codeHash.toString('hex')),
    String(now.getTime()),
    'PX',
    String(deviceCodeTtlSeconds * 1000),
    'GET',
  )) as string | null
  if (previous !== null && now.getTime() - Number(previous) < minPollGapMs) throw errors.slowDown(pollIntervalSeconds)
}

function randomUserCode(): string {
  let out = ''
  while (out.length < 8) {
    for (const byte of randomBytes(16)) {
      // 240 = 12 * 20: rejecting bytes above it keeps every letter equally likely
      if (byte < 240 && out.length < 8) out += userCodeAlphabet[byte % 20]
    }
  }
  return out
}
