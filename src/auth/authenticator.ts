/** Turns request headers into a principal: Bearer JWT, Bearer sk_ key, or X-API-Key agent key. */
import type { DatabaseIdentity, Sql } from '../db.ts'
import { errors } from '../errors.ts'
import { addressBucket, type ClientIp } from '../http/client-ip.ts'
import { bearerTokenOf } from '../http/formats.ts'
import { hashKeyHex, keyKind } from './api-key.ts'
import type { VerifyJwt } from './jwt.ts'
import type { KeyCache } from './key-cache.ts'
import type { Principal } from './principal.ts'
import { upsertUser } from './store.ts'
import type { UnknownKeyLimit } from './unknown-keys.ts'

export interface Authenticator {
  /**
   * The caller, or null when no credential was sent; throws 401 `invalid_token` for a bad one.
   * `prefer` picks which header wins when both are sent (agent routes read X-API-Key first).
   */
  authenticate(request: Request, server: RequestServer, prefer?: 'user' | 'agent'): Promise<Principal | null>
  keys: KeyCache
}

export interface AuthenticatorOptions {
  sql: Sql
  verifyJwt: VerifyJwt
  keys: KeyCache
  database: Pick<DatabaseIdentity, 'onChange'>
  /** Who sent a request, for what keys it does not know may cost (`unknownKeys`). */
  clientIp: ClientIp
  unknownKeys: UnknownKeyLimit
}

const userTtlMs = 60_000

/** The server a request came through: what its sender's address is read from. */
type RequestServer = Parameters<ClientIp>[0]

/** The token of an `Authorization: Bearer <token>` header; throws 401 for any other form. */
function bearerToken(header: string): string {
  const token = bearerTokenOf(header)
  if (token === undefined) throw errors.invalidToken('The Authorization header must be "Bearer <token>"')
  return token
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

export function createAuthenticator(options: AuthenticatorOptions): Authenticator {
  const { sql, verifyJwt, keys, database, clientIp, unknownKeys } = options
  // JWT subject -> user id, so a signed-in user costs one signature check, not a query, per call.
  // Emptied when the pools reach another Postgres, which may not have the user (their writes failed
  // on its foreign keys): their next call signs them in there. A sign-in under way as that is noticed
  // may have read the database before, so it keeps nothing (as the key cache's loads).
  const users = new Map<string, { id: string; expires: number }>()
  let databasesSeen = 0
  database.onChange(() => {
    databasesSeen++
    users.clear()
  })

  // Synchronous when the cache answers: this is every poll's path. A hash the cache knows as live is
  // that issued key (so its checksum is good); any other key has its checksum checked before the query,
  // and its address what made-up keys it has sent (only then is the address read). A key once issued
  // (revoked, rotated out) is not counted: agents that poll on with one cost their address nothing.
  const fromKey = (key: string, request: Request, server: RequestServer): Principal | Promise<Principal> => {
    const hex = hashKeyHex(key)
    const cached = keys.peek(hex)
    if (typeof cached === 'object') return cached
    if (cached !== undefined || !keyKind(key)) throw errors.invalidToken()
    const subject = `ip:${addressBucket(clientIp(server, request))}`
    unknownKeys.admit(subject)
    return keys.lookup(hex).then(status => {
      if (typeof status === 'object') return status
      if (status === 'unknown') unknownKeys.missed(subject)
      throw errors.invalidToken()
    })
  }

  const fromJwt = async (token: string): Promise<Principal> => {
    const claims = await verifyJwt(token)
    const hit = users.get(claims.sub)
    if (hit && hit.expires > performance.now()) return { kind: 'user', userId: hit.id, keyId: null }
    const seen = databasesSeen
    const id = await upsertUser(sql, claims)
    if (databasesSeen !== seen) return { kind: 'user', userId: id, keyId: null }
    if (users.size > 100_000) users.clear()
    users.set(claims.sub, { id, expires: performance.now() + userTtlMs })
    return { kind: 'user', userId: id, keyId: null }
  }

  const fromBearer = (header: string, request: Request, server: RequestServer): Principal | Promise<Principal> => {
    const token = bearerToken(header)
    return token.startsWith('sk_') ? fromKey(token, request, server) : fromJwt(token)
  }

  const fromApiKey = (key: string, request: Request, server: RequestServer): Principal | Promise<Principal> => {
    if (!key.startsWith('sk_agt_')) throw errors.invalidToken('X-API-Key takes an agent key (sk_agt_...)')
    return fromKey(key, request, server)
  }

  return {
    keys,
    async authenticate(request, server, prefer = 'user') {
      const authorization = request.headers.get('authorization')
      const apiKey = request.headers.get('x-api-key')
      if (prefer === 'agent' && apiKey) return fromApiKey(apiKey.trim(), request, server)
      if (authorization) return fromBearer(authorization, request, server)
      if (apiKey) return fromApiKey(apiKey.trim(), request, server)
      return null
    },
  }
}
