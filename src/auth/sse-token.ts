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

export async function issueSseToken({ redis, keys, clock }: TokenDeps, userId: string): Promise<string> {
  const token = randomUUID()
  const expiresAt = clock.now().getTime() + sseTokenTtlSeconds * 1000
  // Redis forgets it on its own; the stored expiry keeps the rule exact under an injected clock.
  await redis.set(keys.sseToken(token), `${userId} ${expiresAt}`, 'EX', sseTokenTtlSeconds + 5)
  return token
}

/** The user a token was issued to, spending it; null when unknown, used or expired. */
export async function spendSseToken({ redis, keys, clock }: TokenDeps, token: string): Promise<string | null> {
  if (!isUuid(token)) return null
  const value = await redis.getdel(keys.sseToken(token))
  if (!value) return null
  const [userId, expiresAt] = value.split(' ')
  return Number(expiresAt) > clock.now().getTime() ? userId! : null
}
