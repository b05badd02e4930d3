/** JWT verification with jose: HS256 by shared secret and/or RS256, ES256, EdDSA from a remote JWKS. */
import {
  createLocalJWKSet,
  createRemoteJWKSet,
  decodeProtectedHeader,
  errors as joseErrors,
  jwksCache,
  jwtVerify,
  type ExportedJWKSCache,
  type JWKSCacheInput,
  type JWTPayload,
  type JWTVerifyGetKey,
  type RemoteJWKSet,
} from 'jose'
import type { Config } from '../config.ts'
import { errors } from '../errors.ts'
import { errorFields, throttled, type Log } from '../log.ts'
import { isStorableText } from '../text.ts'
import { checksumAddress } from './wallet.ts'
import type { KeptKeySet } from './kept-key-set.ts'

export interface TokenClaims {
  sub: string
  email: string | null
  walletAddress: string | null
}

export type VerifyJwt = (token: string) => Promise<TokenClaims>

const asymmetric = ['RS256', 'ES256', 'EdDSA']

/** How far the issuer's clock may be from ours, for `exp`, `nbf` and `iat`. */
export const clockSkewSeconds = 60

/**
 * How long after the last fetch of the JWKS that succeeded its keys still verify tokens while the
 * provider cannot be reached: a day, as long as a token may live by default (`AUTH_MAX_TOKEN_AGE`),
 * long enough to ride out a provider's outage, short enough that a process cut off from it for good
 * stops trusting keys the provider may have withdrawn meanwhile.
 */
export const staleKeysForMs = 24 * 3_600_000

/**
 * Builds the verifier for the configured algorithms only: a token signed any other way is refused.
 * A token must carry `exp`, and live no longer than `AUTH_MAX_TOKEN_AGE` (from `iat`, or from now
 * without one); `nbf` and `iat` may not be in the future, each within the clock skew. An HS256 token
 * whose signature the secret does not check is tried with `AUTH_JWT_SECRET_PREVIOUS`, when set: while
 * the identity provider moves to a new secret, tokens signed with either arrive (docs/operations.md).
 * While the JWKS cannot be fetched, the last key set fetched verifies tokens for `staleKeysForMs`
 * (see `withStaleKeys`); with `kept`, each set fetched is kept there, and a process with none of its
 * own takes the one kept by another, under the same rule.
 *
 * @example
 * const verify = createJwtVerifier(config.auth, log, keptKeySet(redis, keys.jwks, config.auth.jwksUrl, staleKeysForMs))
 * const { sub } = await verify(token)
 */
export function createJwtVerifier(auth: Config['auth'], log: Log, kept?: KeptKeySet): VerifyJwt {
  const secrets = [auth.jwtSecret, auth.jwtSecretPrevious].filter(Boolean).map(text => new TextEncoder().encode(text))
  // jose writes the set and the time of each fetch that succeeded here (and `withStaleKeys` a kept one).
  const lastGood: JWKSCacheInput = {}
  const remote = auth.jwksUrl
    ? createRemoteJWKSet(new URL(auth.jwksUrl), { cooldownDuration: 30_000, cacheMaxAge: 600_000, [jwksCache]: lastGood })
    : undefined
  const jwks = remote && withStaleKeys(remote, lastGood, log, kept)
  const options = {
    ...(auth.issuer ? { issuer: auth.issuer } : {}),
    ...(auth.audience ? { audience: auth.audience } : {}),
    requiredClaims: ['exp'],
    clockTolerance: clockSkewSeconds,
  }

  return async token => {
    let alg: string | undefined
    try {
      alg = decodeProtectedHeader(token).alg
    } catch {
      throw errors.invalidToken()
    }
    let payload: JWTPayload
    try {
      if (alg === 'HS256' && secrets.length > 0) {
        payload = await verifyHs256(token, secrets, { ...options, algorithms: ['HS256'] })
      } else if (alg && asymmetric.includes(alg) && jwks) {
        payload = (await jwtVerify(token, jwks, { ...options, algorithms: asymmetric })).payload
      } else {
        throw errors.invalidToken()
      }
    } catch (error) {
      if (isJwksUnreachable(error)) throw errors.unavailable('The identity provider keys could not be fetched')
      throw errors.invalidToken()
    }
    checkLifetime(payload, auth.maxTokenAgeSeconds)
    return claimsOf(payload)
  }
}

/** What the service takes from a verified token's payload; 401 without a subject it can store. */
export function claimsOf(payload: JWTPayload): TokenClaims {
  if (typeof payload.sub !== 'string' || payload.sub.length === 0 || payload.sub.length > 255) {
    throw errors.invalidToken('The token has no subject')
  }
  // Stored as is, a lone surrogate would become U+FFFD: subjects that differ only there would share one user.
  if (!isStorableText(payload.sub)) throw errors.invalidToken('The token’s subject holds a NUL character or an unpaired surrogate')
  const email = payload.email
  return {
    sub: payload.sub,
    // an email that cannot be stored is ignored, as an overlong one is
    email: typeof email === 'string' && email.length <= 320 && isStorableText(email) ? email : null,
    // the same rule as PATCH /v1/auth/me: stored in EIP-55 form, a bad mixed-case checksum ignored
    walletAddress: typeof payload.wallet_address === 'string' ? checksumAddress(payload.wallet_address) : null,
  }
}

/** The payload of a token signed with one of `secrets`: the next is tried only when a signature does not match. */
async function verifyHs256(token: string, secrets: Uint8Array[], options: Parameters<typeof jwtVerify>[2]): Promise<JWTPayload> {
  for (let i = 0; ; i++) {
    try {
      return (await jwtVerify(token, secrets[i]!, options)).payload
    } catch (error) {
      if (!(error instanceof joseErrors.JWSSignatureVerificationFailed) || i === secrets.length - 1) throw error
    }
  }
}

/**
 * After a fetch of the JWKS failed, how long tokens are checked with the last set's keys without
 * asking the provider again: one that hangs held every such request for jose's 5 s timeout. A token
 * whose `kid` that set lacks is refused meanwhile (503) without a fetch: jose's cooldown counts from
 * the last fetch that succeeded, so each such token would otherwise have the failing provider asked.
 * A process with no set to use (none fetched yet, or a day old) asks at every token.
 */
export const askAgainAfterMs = 30_000

/**
 * The keys of `remote`, or, when its set is due and the provider cannot be reached, those of the last
 * set fetched (`lastGood`, jose's record of it) up to `staleKeysForMs` after that fetch: an outage of
 * the provider no longer refuses tokens that the keys already held verify. A token whose key is not in
 * that set still fails as unreachable (503: a key published since cannot be told from a made-up one);
 * a provider that answers goes on deciding as before (a set without the key: 401; a new set: used).
 * After a failed fetch the provider is asked again only `askAgainAfterMs` later, whatever the token's
 * `kid` (unless no set is held), so it is back in use at most that long after it answers again.
 *
 * Each set fetched is kept in `kept` (Redis), and a process that holds no set young enough (one
 * started during the outage) takes the one kept there after a failed fetch, at most once every
 * `askAgainAfterMs`, as though it had fetched it at its original time: siblings that fetched it
 * serve the same tokens, for the same day. Redis out of reach too: no set, 503 as before.
 */
function withStaleKeys(remote: RemoteJWKSet, lastGood: JWKSCacheInput, log: Log, kept?: KeptKeySet): JWTVerifyGetKey {
  const said = throttled(log, 60_000)
  // The fetch time of the set last written to or taken from `kept`, and when `kept` was last read.
  let keptAt: number | undefined
  let lookedAt: number | undefined
  // The local set made from `lastGood`, kept while no newer fetch replaces it (it caches imported keys).
  let stale: { fetchedAt: number; keys: ReturnType<typeof createLocalJWKSet> } | undefined
  let failed: { at: number; error: unknown } | undefined
  /** Whether a set fetched before is young enough to use. */
  const held = (cache: JWKSCacheInput): cache is ExportedJWKSCache => 'uat' in cache && Date.now() - cache.uat < staleKeysForMs
  /** The key from the last set fetched, if it is young enough and holds it; else `error` is thrown. */
  const fromStale = async (header: Parameters<JWTVerifyGetKey>[0], token: Parameters<JWTVerifyGetKey>[1], error: unknown) => {
    if (!held(lastGood)) throw error
    if (stale?.fetchedAt !== lastGood.uat) stale = { fetchedAt: lastGood.uat, keys: createLocalJWKSet(lastGood.jwks) }
    let key: Awaited<ReturnType<JWTVerifyGetKey>>
    try {
      key = await stale.keys(header, token)
    } catch (notThere) {
      throw notThere instanceof joseErrors.JWKSNoMatchingKey ? error : notThere
    }
    said('warn', 'stale-jwks', 'identity provider keys could not be fetched: tokens are verified with the last key set fetched', {
      fetchedAt: new Date(stale.fetchedAt).toISOString(),
      ...errorFields(error),
    })
    return key
  }
  /** Keeps the set jose last fetched, once. A Redis that refuses costs only the siblings' start during an outage. */
  const keep = () => {
    if (!kept || !('uat' in lastGood) || lastGood.uat === keptAt) return
    keptAt = lastGood.uat
    kept
      .save({ jwks: lastGood.jwks, uat: lastGood.uat })
      .catch(error => said('debug', 'jwks-not-kept', 'identity provider keys not kept in Redis', errorFields(error)))
  }
  /** With no set young enough of its own, the one kept by another process, when it is younger. */
  const takeKept = async () => {
    if (!kept || held(lastGood) || (lookedAt !== undefined && Date.now() - lookedAt < askAgainAfterMs)) return
    lookedAt = Date.now()
    const set = await kept.load().catch(() => undefined)
    if (set && held(set) && !('uat' in lastGood && lastGood.uat >= set.uat)) {
      Object.assign(lastGood, set)
      keptAt = set.uat
    }
  }
  return async (header, token) => {
    const resting = failed && Date.now() - failed.at < askAgainAfterMs ? failed : undefined
    // A key the last set lacks is unreachable still, without asking (made-up kids would have it asked at
    // each token). With no set to use (none fetched, or a day old), every token asks, as it always did.
    if (resting && held(lastGood)) return fromStale(header, token, resting.error)
    try {
      const key = await remote(header, token)
      failed = undefined
      keep()
      return key
    } catch (error) {
      keep()
      if (!isJwksUnreachable(error)) throw error
      failed = { at: Date.now(), error }
      await takeKept()
      return fromStale(header, token, error)
    }
  }
}

/** Past what jose checks: `iat` not in the future, and no lifetime longer than the configured maximum. */
function checkLifetime(payload: JWTPayload, maxAgeSeconds: number) {
  const now = Date.now() / 1000
  // jose has checked that exp is there and that exp and iat, when present, are numbers.
  const exp = payload.exp!
  if (payload.iat !== undefined && payload.iat > now + clockSkewSeconds) throw errors.invalidToken('The token is issued in the future')
  const lifetime = payload.iat !== undefined ? exp - payload.iat : exp - now - clockSkewSeconds
  if (lifetime > maxAgeSeconds) throw errors.invalidToken('The token lives longer than this service accepts (AUTH_MAX_TOKEN_AGE)')
}

/**
 * The keys' fetch failed: timed out, refused, the host's name not resolved, or with no file descriptor
 * for its connection (EMFILE, ENFILE); or the provider answered no key set (an error status, no JSON,
 * a malformed set), which says nothing of the caller's token.
 */
function isJwksUnreachable(error: unknown): boolean {
  const code = (error as { code?: string } | null)?.code
  if (code === 'ERR_JWKS_TIMEOUT' || code === 'ERR_JWKS_INVALID' || code === 'EMFILE' || code === 'ENFILE') return true
  // jose's own words for a fetch answered other than 200, or with a body that is not JSON
  if (error instanceof joseErrors.JOSEError && /JSON Web Key Set HTTP response/.test(error.message)) return true
  // Bun's fetch fails with a TypeError: a system error's code (ECONNREFUSED, ENOTFOUND for a name that
  // does not resolve, EAI_AGAIN, ...; not an ERR_ code of the runtime's own), or words that name the
  // fetch or the connection.
  return error instanceof TypeError && (/^E(?!RR_)[A-Z_]+$/.test(code ?? '') || /fetch|connect/i.test(error.message))
}
