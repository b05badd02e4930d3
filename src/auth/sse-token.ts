/** SSE tokens: one-use, 60-second tokens that open one notification stream and nothing else. */
import { randomUUID } from 'node:crypto'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import { isUuid } from '../http/formats.ts'

export const sseTokenTtlSeconds = 60

interface TokenDeps {
  redis: Redis
  keys: Keys
  clock: Clock
}

/** Issues a token for the user; `keyHash` is the API key it was asked for with, if one (the stream ends with that key). */
export async function issueSseToken({ redis, keys, clock }: TokenDeps, userId: string, keyHash: string | null): Promise<string> {
  const token = randomUUID()
  const expiresAt = clock.now().getTime() + sseTokenTtlSeconds * 1000
  // Redis forgets it on its own; the stored expiry keeps the rule exact under an injected clock.
  await redis.set(keys.sseToken(token), `${userId} ${expiresAt} ${keyHash ?? '-'}`, 'EX', sseTokenTtlSeconds + 5)
  return token
}

/**
 * The user a token was issued to and the key it was asked for with, spending it (`spend` false, for a
 * HEAD that opens nothing: only reading it); null when unknown, used or expired.
 */
export async function spendSseToken(
  { redis, keys, clock }: TokenDeps,
  token: string,
  { spend = true }: { spend?: boolean } = {},
): Promise<{ userId: string; keyHash: string | null } | null> {
  if (!isUuid(token)) return null
  const value = spend ? await redis.getdel(keys.sseToken(token)) : await redis.get(keys.sseToken(token))
  if (!value) return null
  const [userId, expiresAt, keyHash] = value.split(' ')
  if (!(Number(expiresAt) > clock.now().getTime())) return null
  return { userId: userId!, keyHash: keyHash && keyHash !== '-' ? keyHash : null }
}
