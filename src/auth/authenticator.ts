/** Turns request headers into a principal: Bearer JWT, Bearer sk_ key, or X-API-Key agent key. */
import type { Server } from 'bun'
import type { Sql } from '../db.ts'
import { AppError, errors } from '../errors.ts'
import { addressBucket, clientIpResolver } from '../http/client-ip.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import { hashKeyHex, keyKind } from './api-key.ts'
import type { VerifyJwt } from './jwt.ts'
import type { KeyCache } from './key-cache.ts'
import type { Principal } from './principal.ts'
import { upsertUser } from './store.ts'

export interface Authenticator {
  /**
   * The caller, or null when no credential was sent; throws 401 `invalid_token` for a bad one, and
   * 429 when the caller's address has sent too many unknown keys (`server` gives its address).
   * `prefer` picks which header wins when both are sent (agent routes read X-API-Key first).
   */
  authenticate(request: Request, server: Server<unknown> | null | undefined, prefer?: 'user' | 'agent'): Promise<Principal | null>
  keys: KeyCache
}

const userTtlMs = 60_000

/** The token of an `Authorization: Bearer <token>` header; throws 401 for any other form. */
function bearerToken(header: string): string {
  const match = /^Bearer[ ]+([^\s]+)[ ]*$/i.exec(header)
  if (!match) throw errors.invalidToken('The Authorization header must be "Bearer <token>"')
  return match[1]!
}

/**
 * The hex hash of the API key a request authenticates with as a user (`Bearer sk_...`), or null for
 * a JWT: what a revocation names, so what is opened with a key (an event stream) can end with it.
 */
export function userKeyHash(headers: Headers): string | null {
  const authorization = headers.get('authorization')
  if (!authorization) return null
  const token = bearerToken(authorization)
  return token.startsWith('sk_') ? hashKeyHex(token) : null
}

/** Where the keys an address sends that no one was issued are counted: each costs a database lookup. */
export interface UnknownKeyBudget {
  limiter: RateLimiter
  trustedProxies: string[]
}

export function createAuthenticator(sql: Sql, verifyJwt: VerifyJwt, keys: KeyCache, unknownKeys?: UnknownKeyBudget): Authenticator {
  // JWT subject -> user id, so a signed-in user costs one signature check, not a query, per call.
  const users = new Map<string, { id: string; expires: number }>()
  const clientIp = clientIpResolver(unknownKeys?.trustedProxies ?? [])

  /**
   * A key not cached, looked up in the database: only while its address has not used up its budget
   * of unknown keys (checked before, charged after a miss: a burst sent at once may pass it by as
   * many as it holds, but no address goes on sending made-up keys at the database's cost).
   */
  const lookup = async (hex: string, address: string | undefined): Promise<Principal> => {
    // Redis away: the lookup goes ahead, as it did before budgets (only an empty budget refuses).
    if (address) await unknownKeys!.limiter.check('unknownApiKeys', address).catch(error => rethrowIf(error instanceof AppError, error))
    const principal = await keys.lookup(hex)
    if (principal) return principal
    if (address) await unknownKeys!.limiter.take('unknownApiKeys', address).catch(() => {})
    throw errors.invalidToken()
  }

  // Synchronous when the cache answers: this is every poll's path. A hash the cache knows as live is
  // that issued key (so its checksum is good); any other key has its checksum checked before the query.
  const fromKey = (key: string, address: () => string | undefined): Principal | Promise<Principal> => {
    const hex = hashKeyHex(key)
    const cached = keys.peek(hex)
    if (cached) return cached
    if (cached === null || !keyKind(key)) throw errors.invalidToken()
    return lookup(hex, address())
  }

  const fromJwt = async (token: string): Promise<Principal> => {
    const claims = await verifyJwt(token)
    const hit = users.get(claims.sub)
    if (hit && hit.expires > Date.now()) return { kind: 'user', userId: hit.id, keyId: null }
    const id = await upsertUser(sql, claims)
    if (users.size > 100_000) users.clear()
    users.set(claims.sub, { id, expires: Date.now() + userTtlMs })
    return { kind: 'user', userId: id, keyId: null }
  }

  const fromBearer = (header: string, address: () => string | undefined): Principal | Promise<Principal> => {
    const token = bearerToken(header)
    return token.startsWith('sk_') ? fromKey(token, address) : fromJwt(token)
  }

  const fromApiKey = (key: string, address: () => string | undefined): Principal | Promise<Principal> => {
    if (!key.startsWith('sk_agt_')) throw errors.invalidToken('X-API-Key takes an agent key (sk_agt_...)')
    return fromKey(key, address)
  }

  return {
    keys,
    async authenticate(request, server, prefer = 'user') {
      const { headers } = request
      // Worked out only for a key that needs a lookup.
      const address = () => (unknownKeys ? `ip:${addressBucket(clientIp(server, request))}` : undefined)
      const authorization = headers.get('authorization')
      const apiKey = headers.get('x-api-key')
      if (prefer === 'agent' && apiKey) return fromApiKey(apiKey.trim(), address)
      if (authorization) return fromBearer(authorization, address)
      if (apiKey) return fromApiKey(apiKey.trim(), address)
      return null
    },
  }
}

function rethrowIf(condition: boolean, error: unknown): void {
  if (condition) throw error
}
