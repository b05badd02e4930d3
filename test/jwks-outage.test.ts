/**
 * The identity provider's JWKS out of reach once its keys are due (10 minutes after their fetch):
 * tokens its last key set verifies keep passing, for a day after that fetch, in a process started
 * during the outage too (the set kept in Redis). The wall clock is moved on (jose times its cache by
 * it), the provider is a real HTTP server on 127.0.0.1.
 */
import { afterEach, describe, expect, setSystemTime, test } from 'bun:test'
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose'
import { askAgainAfterMs, createJwtVerifier, staleKeysForMs, type VerifyJwt } from '../src/auth/jwt.ts'
import { AppError } from '../src/errors.ts'
import { createLog } from '../src/log.ts'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { startRedisServer } from './helpers/redis-server.ts'

const minuteMs = 60_000

// Back to the real clock.
afterEach(() => void setSystemTime())

/** A JWKS endpoint answering `answer()`, counting the requests it was sent. */
function startProvider(answer: () => Response | Promise<Response>) {
  const provider = { requests: 0, answer, server: undefined as unknown as ReturnType<typeof Bun.serve> }
  provider.server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    fetch: () => {
      provider.requests++
      return provider.answer()
    },
  })
  return provider
}

async function rsaKey(kid: string): Promise<{ privateKey: CryptoKey; jwk: JWK }> {
  const { publicKey, privateKey } = await generateKeyPair('RS256')
  return { privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' } }
}

/** A token signed now (by the clock as set), for an hour. */
const sign = (privateKey: CryptoKey, kid: string, sub = 'idp-user') =>
  new SignJWT({}).setProtectedHeader({ alg: 'RS256', kid }).setSubject(sub).setIssuedAt().setExpirationTime('1h').sign(privateKey)

function verifierFor(url: string) {
  const lines: string[] = []
  const verify = createJwtVerifier(
    { jwtSecret: undefined, jwtSecretPrevious: undefined, jwksUrl: url, issuer: undefined, audience: undefined, maxTokenAgeSeconds: 86_400 },
    createLog('debug', line => lines.push(line)),
  )
  const staleRecords = () => lines.map(line => JSON.parse(line)).filter(record => /last key set fetched/.test(record.msg))
  return { verify, staleRecords }
}

/** What `verify` answers: the subject, or the status and code it was refused with. */
async function outcome(verify: VerifyJwt, token: string): Promise<string> {
  try {
    return (await verify(token)).sub
  } catch (error) {
    if (error instanceof AppError) return `${error.status} ${error.code}`
    throw error
  }
}

describe('JWT keys while the identity provider cannot be reached', () => {
  test('a token whose key the last fetched set holds passes through a 500, a hang past the timeout and a refused connection, for a day after that fetch', async () => {
    const k1 = await rsaKey('k-1')
    const k2 = await rsaKey('k-2')
    const forger = await rsaKey('k-1')
    const good = () => Response.json({ keys: [k1.jwk] })
    const provider = startProvider(good)
    const { verify, staleRecords } = verifierFor(`http://127.0.0.1:${provider.server.port}/jwks.json`)
    try {
      // the set is fetched between the two
      const before = Date.now()
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('idp-user')
      const after = Date.now()
      expect(provider.requests).toBe(1)

      const failures: [string, () => Response | Promise<Response>][] = [
        ['500', () => new Response('down', { status: 500 })],
        // never answered: jose gives up after its 5 s timeout
        ['hang', () => new Promise<Response>(() => {})],
      ]
      let at = after
      for (const [name, failure] of failures) {
        provider.answer = failure
        at += 11 * minuteMs
        setSystemTime(new Date(at))
        const asked = provider.requests
        expect([name, await outcome(verify, await sign(k1.privateKey, 'k-1'))]).toEqual([name, 'idp-user'])
        // past the cache's 10 minutes, the provider was asked (and failed) first
        expect(provider.requests).toBeGreaterThan(asked)
        // then left alone for a while: a provider that hangs holds no request for its timeout
        const failedAt = provider.requests
        setSystemTime(new Date(at + askAgainAfterMs - 1000))
        expect([name, await outcome(verify, await sign(k1.privateKey, 'k-1'))]).toEqual([name, 'idp-user'])
        expect(provider.requests).toBe(failedAt)
        // a key published since cannot be told from a made-up one: 503, not 401; nor does it ask the
        // provider within the rest (jose's cooldown counts from the last fetch that succeeded, long
        // ago): made-up kids would have it fetched once a token, and each wait out a hang
        for (const kid of ['k-2', 'made-up-1', 'made-up-2']) {
          expect([name, await outcome(verify, await sign(k2.privateKey, kid))]).toEqual([name, '503 unavailable'])
        }
        expect(provider.requests).toBe(failedAt)
        // a key the set holds that does not check the signature is the token's fault
        expect([name, await outcome(verify, await sign(forger.privateKey, 'k-1'))]).toEqual([name, '401 invalid_token'])
      }

      await provider.server.stop(true)
      at = before + staleKeysForMs - minuteMs
      setSystemTime(new Date(at))
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('idp-user')
      expect(await outcome(verify, await sign(k2.privateKey, 'k-2'))).toBe('503 unavailable')

      // a day after the last fetch that succeeded, its keys are no longer trusted
      setSystemTime(new Date(after + staleKeysForMs + minuteMs))
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('503 unavailable')

      // the outage is told, once a minute at most, with when the keys in use were fetched
      const records = staleRecords()
      expect(records).toHaveLength(1)
      expect(records[0].level).toBe('warn')
      expect(Date.parse(records[0].fetchedAt)).toBeWithin(before, after + 1)
      expect(typeof records[0].error).toBe('string')
    } finally {
      await provider.server.stop(true)
    }
  }, 60_000)

  test('a provider that answers again decides: a set without the key is 401, a rotated set is used, and is the one kept through the next outage', async () => {
    const k1 = await rsaKey('k-1')
    const k2 = await rsaKey('k-2')
    const provider = startProvider(() => Response.json({ keys: [k1.jwk] }))
    const { verify } = verifierFor(`http://127.0.0.1:${provider.server.port}/jwks.json`)
    try {
      let at = Date.now()
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('idp-user')

      provider.answer = () => new Response('down', { status: 500 })
      setSystemTime(new Date((at += 11 * minuteMs)))
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('idp-user')

      // back, with k-1 withdrawn and k-2 published: asked again once the rest after the failure is over
      provider.answer = () => Response.json({ keys: [k2.jwk] })
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('idp-user')
      setSystemTime(new Date((at += askAgainAfterMs)))
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('401 invalid_token')
      expect(await outcome(verify, await sign(k2.privateKey, 'k-2'))).toBe('idp-user')

      // down again: the set kept is the rotated one
      provider.answer = () => new Response('down', { status: 500 })
      setSystemTime(new Date((at += 11 * minuteMs)))
      expect(await outcome(verify, await sign(k2.privateKey, 'k-2'))).toBe('idp-user')
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('503 unavailable')
    } finally {
      await provider.server.stop(true)
    }
  })

  test('with no key set ever fetched, an unreachable provider is 503', async () => {
    const k1 = await rsaKey('k-1')
    const provider = startProvider(() => new Response('down', { status: 500 }))
    const { verify, staleRecords } = verifierFor(`http://127.0.0.1:${provider.server.port}/jwks.json`)
    try {
      expect(await outcome(verify, await sign(k1.privateKey, 'k-1'))).toBe('503 unavailable')
      expect(staleRecords()).toHaveLength(0)
    } finally {
      await provider.server.stop(true)
    }
  })
})

describe('JWT keys in a process started while the identity provider cannot be reached', () => {
  /** Two processes of one deployment (one database, one Redis prefix), the second made by `second()`. */
  async function deployment(url: string, env: Record<string, string> = {}) {
    const contexts: TestContext[] = []
    const first = await createTestContext({ env: { ...env, AUTH_JWKS_URL: url } })
    contexts.push(first)
    const second = async () => {
      const made = await createTestContext({ database: first.database, env: { ...env, AUTH_JWKS_URL: url, REDIS_PREFIX: first.config.redisPrefix } })
      contexts.push(made)
      return made
    }
    // Every context closed, its database dropped, though one's close failed; the first failure thrown.
    const close = async () => {
      const closed = []
      for (const context of contexts.reverse())
        closed.push(
          await context.close().then(
            () => undefined,
            (error: unknown) => error,
          ),
        )
      const failure = closed.find(error => error !== undefined)
      if (failure !== undefined) throw failure instanceof Error ? failure : new Error(String(failure))
    }
    return { first, second, close }
  }
  /** The status of GET /v1/auth/me with `token`, and its error code when refused. */
  const me = async (context: TestContext, token: string) => {
    const res = await context.call('GET', '/v1/auth/me', { token })
    return res.status === 200 ? '200' : `${res.status} ${res.body.error}`
  }

  test('verifies with the set another process fetched, kept in Redis, for a day after that fetch', async () => {
    const k1 = await rsaKey('k-1')
    const k2 = await rsaKey('k-2')
    const provider = startProvider(() => Response.json({ keys: [k1.jwk] }))
    const { first, second, close } = await deployment(`http://127.0.0.1:${provider.server.port}/jwks.json`)
    try {
      const before = Date.now()
      expect(await me(first, await sign(k1.privateKey, 'k-1', 'kept-alice'))).toBe('200')
      await provider.server.stop(true)

      // Started now, it never reached the provider: its siblings' set is the one it uses, taken here
      // half a day after that set's fetch.
      const started = await second()
      setSystemTime(new Date(before + staleKeysForMs / 2))
      expect(await me(started, await sign(k1.privateKey, 'k-1', 'kept-alice'))).toBe('200')
      expect(await me(started, await sign(k1.privateKey, 'k-1', 'kept-bob'))).toBe('200')
      // A key not in that set: 503 (a key published since cannot be told from a made-up one).
      expect(await me(started, await sign(k2.privateKey, 'k-2', 'kept-bob'))).toBe('503 unavailable')

      // The day counts from the set's fetch, not from when this process took it.
      setSystemTime(new Date(before + staleKeysForMs - minuteMs))
      expect(await me(started, await sign(k1.privateKey, 'k-1', 'kept-alice'))).toBe('200')
      setSystemTime(new Date(before + staleKeysForMs + minuteMs))
      expect(await me(started, await sign(k1.privateKey, 'k-1', 'kept-alice'))).toBe('503 unavailable')
    } finally {
      setSystemTime()
      await provider.server.stop(true)
      await close()
    }
  })

  test('with Redis out of reach too, it has no set: 503', async () => {
    const k1 = await rsaKey('k-1')
    const provider = startProvider(() => Response.json({ keys: [k1.jwk] }))
    const redis = await startRedisServer()
    const { first, second, close } = await deployment(`http://127.0.0.1:${provider.server.port}/jwks.json`, { REDIS_URL: redis.url })
    try {
      const started = await second()
      expect(await me(first, await sign(k1.privateKey, 'k-1', 'kept-carol'))).toBe('200')
      await provider.server.stop(true)
      await redis.down({ keepData: true })
      expect(await me(started, await sign(k1.privateKey, 'k-1', 'kept-carol'))).toBe('503 unavailable')
      // The one that fetched the set still holds it.
      expect(await me(first, await sign(k1.privateKey, 'k-1', 'kept-carol'))).toBe('200')
    } finally {
      await provider.server.stop(true)
      await redis.up()
      await close()
      await redis.close()
    }
  })
})
