import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createHash, randomBytes } from 'node:crypto'
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose'
import { startRedisServer } from './helpers/redis-server.ts'
import { until } from './helpers/until.ts'
import { touchKeys } from '../src/auth/store.ts'
import { generateKey } from '../src/auth/api-key.ts'
import { checksumAddress } from '../src/auth/wallet.ts'
import { createLog } from '../src/log.ts'
import {
  createAgent,
  createTestContext,
  expectError,
  signUp,
  testJwtSecret,
  userToken,
  type CallResult,
  type TestContext,
  type TestUser,
} from './helpers/context.ts'

const isoMs = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
const base62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

let ctx: TestContext
let alice: TestUser
let bob: TestUser

beforeAll(async () => {
  ctx = await createTestContext()
  alice = await signUp(ctx)
  bob = await signUp(ctx)
})
afterAll(() => ctx.close())

/** A 401 in the contract's envelope that also carries `WWW-Authenticate: Bearer ...`. */
function expect401(result: CallResult, code: 'unauthorized' | 'invalid_token') {
  expectError(result, 401, code)
  expect(result.headers.get('www-authenticate') ?? '').toStartWith('Bearer')
}

function hs256(claims: Record<string, unknown>, secret = testJwtSecret) {
  return new SignJWT(claims).setProtectedHeader({ alg: 'HS256' }).sign(new TextEncoder().encode(secret))
}

const b64url = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
const nowSeconds = () => Math.floor(Date.now() / 1000)

async function createUserKey(user: TestUser, name = 'laptop') {
  const res = await ctx.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name } })
  expect(res.status).toBe(201)
  return res.body.data as { id: string; name: string; key: string; createdAt: string }
}

/** The same key with its last checksum character replaced by another base62 character. */
function corrupt(key: string): string {
  const last = key.at(-1)!
  return key.slice(0, -1) + base62[(base62.indexOf(last) + 1) % 62]
}

describe('JWT bearer (HS256)', () => {
  test('the first valid token of a new subject creates the user and /me returns the profile', async () => {
    const sub = `new-${randomBytes(4).toString('hex')}`
    const token = await userToken(sub, { email: `${sub}@example.com` })
    const res = await ctx.call('GET', '/v1/auth/me', { token })
    expect(res.status).toBe(200)
    expect(res.body.success).toBe(true)
    expect(Object.keys(res.body.data).sort()).toEqual(['createdAt', 'email', 'id', 'providerId', 'walletAddress'])
    expect(res.body.data).toMatchObject({ providerId: sub, email: `${sub}@example.com`, walletAddress: null })
    expect(res.body.data.id).toMatch(uuid)
    expect(res.body.data.createdAt).toMatch(isoMs)
    const [row] = await ctx.deps.sql`select count(*)::int as n from users where provider_id = ${sub}`
    expect(row).toEqual({ n: 1 })

    const again = await ctx.call('GET', '/v1/auth/me', { token: await userToken(sub) })
    expect(again.body.data.id).toBe(res.body.data.id)
  })

  test('an expired token is 401 invalid_token with WWW-Authenticate', async () => {
    const sub = `expired-${randomBytes(4).toString('hex')}`
    const token = await hs256({ sub, iat: nowSeconds() - 7200, exp: nowSeconds() - 60 })
    expect401(await ctx.call('GET', '/v1/auth/me', { token }), 'invalid_token')
    const [row] = await ctx.deps.sql`select count(*)::int as n from users where provider_id = ${sub}`
    expect(row).toEqual({ n: 0 })
  })

  test('a token signed with another secret is 401 invalid_token', async () => {
    const token = await userToken(alice.sub, {}, { secret: 'another-secret-that-is-at-least-32-characters' })
    expect401(await ctx.call('GET', '/v1/auth/me', { token }), 'invalid_token')
  })

  test('an unsigned alg:none token is 401 invalid_token', async () => {
    const payload = b64url({ sub: alice.sub, exp: nowSeconds() + 3600 })
    for (const token of [`${b64url({ alg: 'none', typ: 'JWT' })}.${payload}.`, `${b64url({ alg: 'HS256' })}.${payload}.`]) {
      expect401(await ctx.call('GET', '/v1/auth/me', { token }), 'invalid_token')
    }
  })

  test('email and wallet_address claims fill the new user’s profile, the wallet in EIP-55 form', async () => {
    const sub = `claims-${randomBytes(4).toString('hex')}`
    const token = await userToken(sub, { email: 'c@example.com', wallet_address: '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed' })
    const res = await ctx.call('GET', '/v1/auth/me', { token })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ email: 'c@example.com', walletAddress: '0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed' })
  })

  test('a wallet_address claim with a wrong checksum is ignored, not stored', async () => {
    const sub = `claims-${randomBytes(4).toString('hex')}`
    const token = await userToken(sub, { wallet_address: '0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD' })
    const res = await ctx.call('GET', '/v1/auth/me', { token })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ providerId: sub, email: null, walletAddress: null })
  })

  test('a token in an algorithm that is not configured is 401 invalid_token', async () => {
    const hs512 = await new SignJWT({ sub: alice.sub })
      .setProtectedHeader({ alg: 'HS512' })
      .setExpirationTime('1h')
      .sign(new TextEncoder().encode(testJwtSecret))
    expect401(await ctx.call('GET', '/v1/auth/me', { token: hs512 }), 'invalid_token')
    // no JWKS is configured here, so an asymmetric token has nothing to be checked against
    const { privateKey } = await generateKeyPair('RS256')
    const rs256 = await new SignJWT({ sub: alice.sub }).setProtectedHeader({ alg: 'RS256' }).setExpirationTime('1h').sign(privateKey)
    expect401(await ctx.call('GET', '/v1/auth/me', { token: rs256 }), 'invalid_token')
  })

  test('a token without a subject is 401 invalid_token', async () => {
    const token = await hs256({ exp: nowSeconds() + 3600 })
    expect401(await ctx.call('GET', '/v1/auth/me', { token }), 'invalid_token')
  })

  test('a subject with a lone surrogate or a NUL is 401 invalid_token: it cannot pass for another subject', async () => {
    const base = `surrogate-${randomBytes(4).toString('hex')}`
    const owner = await ctx.call('GET', '/v1/auth/me', { token: await userToken(`${base}\ufffd`) })
    expect(owner.status).toBe(200)
    // Postgres would store each of these as the owner's subject (U+FFFD in place of the surrogate).
    for (const sub of [`${base}\ud800`, `${base}\udfff`, `${base}\u0000`]) {
      expect401(await ctx.call('GET', '/v1/auth/me', { token: await userToken(sub) }), 'invalid_token')
    }
    const rows = await ctx.deps.sql`select 1 from users where provider_id like ${`${base}%`}`
    expect(rows).toHaveLength(1)
  })

  test('an email claim that cannot be stored is ignored, as an overlong one is', async () => {
    const sub = `claims-${randomBytes(4).toString('hex')}`
    const res = await ctx.call('GET', '/v1/auth/me', { token: await userToken(sub, { email: 'a\u0000@example.com' }) })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ providerId: sub, email: null })
  })

  test.each(['Basic x', 'Bearer', 'Bearer ', 'Bearer a b', 'Bearer not-a-jwt', `Token ${'x'.repeat(10)}`])(
    'the Authorization header %p is 401 invalid_token',
    async authorization => {
      expect401(await ctx.call('GET', '/v1/auth/me', { headers: { authorization } }), 'invalid_token')
    },
  )

  test('no credential at all is 401 unauthorized with WWW-Authenticate', async () => {
    expect401(await ctx.call('GET', '/v1/auth/me'), 'unauthorized')
    expect401(await ctx.call('GET', '/v1/auth/api-keys'), 'unauthorized')
  })
})

describe('JWT lifetime', () => {
  const newSub = () => `life-${randomBytes(4).toString('hex')}`
  const hour = 3600
  const accepted = async (claims: Record<string, unknown>, c: TestContext = ctx) => {
    const res = await c.call('GET', '/v1/auth/me', { token: await hs256({ sub: newSub(), ...claims }) })
    if (res.status === 200) return true
    expect401(res, 'invalid_token')
    return false
  }

  test('a token without exp is 401 invalid_token, and creates no user', async () => {
    const sub = newSub()
    for (const claims of [{ sub }, { sub, iat: nowSeconds() }, { sub, iat: nowSeconds(), nbf: nowSeconds() }]) {
      expect401(await ctx.call('GET', '/v1/auth/me', { token: await hs256(claims) }), 'invalid_token')
    }
    const [row] = await ctx.deps.sql`select count(*)::int as n from users where provider_id = ${sub}`
    expect(row).toEqual({ n: 0 })
  })

  test('a lifetime (exp - iat) over AUTH_MAX_TOKEN_AGE, 24 h by default, is refused; up to it is accepted', async () => {
    const now = nowSeconds()
    expect(await accepted({ iat: now, exp: now + 24 * hour })).toBe(true)
    expect(await accepted({ iat: now, exp: now + 24 * hour + 1 })).toBe(false)
    expect(await accepted({ iat: now, exp: now + 10 * 365 * 24 * hour })).toBe(false)
    // Issued long ago with a far exp: not a way around the limit.
    expect(await accepted({ iat: now - 30 * hour, exp: now + hour })).toBe(false)
  })

  test('without iat the lifetime is counted from now', async () => {
    const now = nowSeconds()
    expect(await accepted({ exp: now + 23 * hour })).toBe(true)
    expect(await accepted({ exp: now + 25 * hour })).toBe(false)
  })

  test('iat or nbf in the future is refused past 60 s of clock skew, accepted within it', async () => {
    const now = nowSeconds()
    expect(await accepted({ iat: now + 30, exp: now + hour })).toBe(true)
    expect(await accepted({ iat: now + 120, exp: now + hour })).toBe(false)
    expect(await accepted({ iat: now, nbf: now + 30, exp: now + hour })).toBe(true)
    expect(await accepted({ iat: now, nbf: now + 120, exp: now + hour })).toBe(false)
    expect(await accepted({ iat: 'yesterday', exp: now + hour })).toBe(false)
  })

  test('AUTH_MAX_TOKEN_AGE sets the limit', async () => {
    const short = await createTestContext({ env: { AUTH_MAX_TOKEN_AGE: '3600' } })
    try {
      const now = nowSeconds()
      expect(await accepted({ iat: now, exp: now + hour }, short)).toBe(true)
      expect(await accepted({ iat: now, exp: now + 2 * hour }, short)).toBe(false)
      expect(await accepted({ exp: now + 2 * hour }, short)).toBe(false)
    } finally {
      await short.close()
    }
  })
})

describe('JWT bearer (remote JWKS)', () => {
  let jwks: ReturnType<typeof Bun.serve>
  let idp: TestContext
  let rsa: CryptoKey
  let ec: CryptoKey
  let ed: CryptoKey

  beforeAll(async () => {
    const rsaPair = await generateKeyPair('RS256')
    const ecPair = await generateKeyPair('ES256')
    const edPair = await generateKeyPair('EdDSA', { crv: 'Ed25519' })
    rsa = rsaPair.privateKey
    ec = ecPair.privateKey
    ed = edPair.privateKey
    const keys: JWK[] = [
      { ...(await exportJWK(rsaPair.publicKey)), kid: 'rsa-1', alg: 'RS256', use: 'sig' },
      { ...(await exportJWK(ecPair.publicKey)), kid: 'ec-1', alg: 'ES256', use: 'sig' },
      { ...(await exportJWK(edPair.publicKey)), kid: 'ed-1', alg: 'EdDSA', use: 'sig' },
    ]
    jwks = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      fetch: request => (new URL(request.url).pathname === '/jwks.json' ? Response.json({ keys }) : new Response('not found', { status: 404 })),
    })
    idp = await createTestContext({
      env: {
        AUTH_JWKS_URL: `http://127.0.0.1:${jwks.port}/jwks.json`,
        AUTH_ISSUER: 'https://idp.test',
        AUTH_AUDIENCE: 'marketplace',
      },
    })
  })
  afterAll(async () => {
    await idp.close()
    await jwks.stop(true)
  })

  const sign = (key: CryptoKey, alg: string, kid: string, options: { sub?: string; iss?: string; aud?: string } = {}) =>
    new SignJWT({ email: 'jwks@example.com' })
      .setProtectedHeader({ alg, kid })
      .setSubject(options.sub ?? `idp-${randomBytes(4).toString('hex')}`)
      .setIssuer(options.iss ?? 'https://idp.test')
      .setAudience(options.aud ?? 'marketplace')
      .setIssuedAt()
      .setExpirationTime('10m')
      .sign(key)

  test('an RS256 token with the right issuer and audience signs the user in', async () => {
    const sub = `idp-${randomBytes(4).toString('hex')}`
    const res = await idp.call('GET', '/v1/auth/me', { token: await sign(rsa, 'RS256', 'rsa-1', { sub }) })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ providerId: sub, email: 'jwks@example.com', walletAddress: null })
  })

  test('an ES256 token from the same key set signs the user in', async () => {
    const res = await idp.call('GET', '/v1/auth/me', { token: await sign(ec, 'ES256', 'ec-1') })
    expect(res.status).toBe(200)
    expect(res.body.data.id).toMatch(uuid)
  })

  test('an EdDSA token from the same key set signs the user in', async () => {
    const res = await idp.call('GET', '/v1/auth/me', { token: await sign(ed, 'EdDSA', 'ed-1') })
    expect(res.status).toBe(200)
    expect(res.body.data.id).toMatch(uuid)
  })

  test('a wrong audience is 401 invalid_token', async () => {
    const token = await sign(rsa, 'RS256', 'rsa-1', { aud: 'someone-else' })
    expect401(await idp.call('GET', '/v1/auth/me', { token }), 'invalid_token')
  })

  test('a wrong issuer is 401 invalid_token', async () => {
    const token = await sign(rsa, 'RS256', 'rsa-1', { iss: 'https://evil.test' })
    expect401(await idp.call('GET', '/v1/auth/me', { token }), 'invalid_token')
  })

  test('a token signed by a different RSA key under a known kid is 401 invalid_token', async () => {
    const { privateKey } = await generateKeyPair('RS256')
    expect401(await idp.call('GET', '/v1/auth/me', { token: await sign(privateKey, 'RS256', 'rsa-1') }), 'invalid_token')
    expect401(await idp.call('GET', '/v1/auth/me', { token: await sign(privateKey, 'RS256', 'unknown-kid') }), 'invalid_token')
  })

  test('an HS256 token keyed with the public JWK (algorithm confusion) is 401 invalid_token', async () => {
    const publicJwk = await (await fetch(`http://127.0.0.1:${jwks.port}/jwks.json`)).text()
    const token = await hs256({ sub: 'confused', iss: 'https://idp.test', aud: 'marketplace', exp: nowSeconds() + 600 }, publicJwk)
    expect401(await idp.call('GET', '/v1/auth/me', { token }), 'invalid_token')
  })
})

describe('JWT bearer when the JWKS endpoint fails', () => {
  test('a key set answered with an error status, as no JSON, or malformed is 503, not the caller’s token refused; once it is back the token passes', async () => {
    const { publicKey, privateKey } = await generateKeyPair('RS256')
    const keys = [{ ...(await exportJWK(publicKey)), kid: 'k-1', alg: 'RS256' }]
    let answer = () => new Response('upstream down', { status: 503 })
    const jwks = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => answer() })
    const idp = await createTestContext({ env: { AUTH_JWKS_URL: `http://127.0.0.1:${jwks.port}/jwks.json` } })
    try {
      const token = await new SignJWT({})
        .setProtectedHeader({ alg: 'RS256', kid: 'k-1' })
        .setSubject(`idp-${randomBytes(4).toString('hex')}`)
        .setIssuedAt()
        .setExpirationTime('10m')
        .sign(privateKey)
      const failures = [
        () => new Response('upstream down', { status: 503 }),
        () => new Response('<html>maintenance</html>', { status: 200 }),
        () => Response.json({ error: 'not a key set' }),
      ]
      for (const failure of failures) {
        answer = failure
        expectError(await idp.call('GET', '/v1/auth/me', { token }), 503, 'unavailable')
      }
      answer = () => Response.json({ keys })
      expect((await idp.call('GET', '/v1/auth/me', { token })).status).toBe(200)
    } finally {
      await idp.close()
      await jwks.stop(true)
    }
  })

  test('a JWKS host whose name does not resolve is 503, as one that refuses the connection is', async () => {
    // .invalid never resolves (RFC 6761): what a DNS outage looks like to the process.
    const idp = await createTestContext({ env: { AUTH_JWKS_URL: 'http://idp.example.invalid/jwks.json' } })
    try {
      const { privateKey } = await generateKeyPair('RS256')
      const token = await new SignJWT({}).setProtectedHeader({ alg: 'RS256', kid: 'k-1' }).setSubject('dns').setExpirationTime('10m').sign(privateKey)
      expectError(await idp.call('GET', '/v1/auth/me', { token }), 503, 'unavailable')
    } finally {
      await idp.close()
    }
  })
})

describe('wallet address', () => {
  const lower = '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed'
  const eip55 = '0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed'
  const otherEip55 = '0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359'

  const patch = (user: TestUser, body: unknown) => ctx.call('PATCH', '/v1/auth/me', { token: user.token, body })
  const storedWallet = async (user: TestUser) => (await ctx.call('GET', '/v1/auth/me', { token: user.token })).body.data.walletAddress

  test('an all-lowercase address is accepted and returned in EIP-55 form', async () => {
    const user = await signUp(ctx)
    const res = await patch(user, { walletAddress: lower })
    expect(res.status).toBe(200)
    expect(res.body.data).toMatchObject({ id: user.id, walletAddress: eip55 })
    expect(await storedWallet(user)).toBe(eip55)
  })

  test('an all-uppercase address is accepted and returned in EIP-55 form', async () => {
    const user = await signUp(ctx)
    const res = await patch(user, { walletAddress: `0x${lower.slice(2).toUpperCase()}` })
    expect(res.status).toBe(200)
    expect(res.body.data.walletAddress).toBe(eip55)
  })

  test('a correctly checksummed mixed-case address is accepted as is', async () => {
    const user = await signUp(ctx)
    const res = await patch(user, { walletAddress: otherEip55 })
    expect(res.status).toBe(200)
    expect(res.body.data.walletAddress).toBe(otherEip55)
  })

  test('a mixed-case address with a wrong checksum is 400 at /walletAddress and changes nothing', async () => {
    const user = await signUp(ctx)
    expect((await patch(user, { walletAddress: eip55 })).status).toBe(200)
    // one letter's case flipped: still mixed case, no longer the EIP-55 form
    const wrong = eip55.slice(0, -1) + eip55.at(-1)!.toUpperCase()
    const body = expectError(await patch(user, { walletAddress: wrong }), 400, 'validation_failed')
    expect(body.details).toEqual([{ path: '/walletAddress', message: expect.any(String) }])
    expect(await storedWallet(user)).toBe(eip55)
  })

  test.each([
    ['not hex', '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaeg'],
    ['too short', lower.slice(0, -1)],
    ['too long', `${lower}0`],
    ['no 0x', `00${lower.slice(2)}`],
    ['empty', ''],
  ])('an address that is %s is 400 at /walletAddress and changes nothing', async (_, walletAddress) => {
    const user = await signUp(ctx)
    expect((await patch(user, { walletAddress: otherEip55 })).status).toBe(200)
    const body = expectError(await patch(user, { walletAddress }), 400, 'validation_failed')
    expect(body.details[0].path).toBe('/walletAddress')
    expect(await storedWallet(user)).toBe(otherEip55)
  })

  test('an unknown field, a missing address or a non-string is 400 and changes nothing (null clears it)', async () => {
    const user = await signUp(ctx)
    expect((await patch(user, { walletAddress: otherEip55 })).status).toBe(200)
    for (const body of [{ walletAddress: lower, email: 'x@example.com' }, {}, { walletAddress: 42 }, { walletAddress: [] }]) {
      const error = expectError(await patch(user, body), 400, 'validation_failed')
      expect(error.details.length).toBeGreaterThan(0)
    }
    expectError(await ctx.call('PATCH', '/v1/auth/me', { token: user.token, rawBody: '{"walletAddress":' }), 400, 'invalid_json')
    expect(await storedWallet(user)).toBe(otherEip55)
  })

  test('updates at once each answer the profile as their own write left it, not another’s', async () => {
    const user = await signUp(ctx)
    const answered: [string, string][] = []
    for (let round = 0; round < 10; round++) {
      const addresses = Array.from({ length: 8 }, () => checksumAddress(`0x${randomBytes(20).toString('hex')}`)!)
      const results = await Promise.all(addresses.map(address => patch(user, { walletAddress: address })))
      results.forEach((res, i) => answered.push([addresses[i]!, res.body.data.walletAddress]))
    }
    expect(answered.filter(([sent, got]) => sent !== got)).toEqual([])
  })

  test('no credential is 401 and an agent key is 403', async () => {
    expect401(await ctx.call('PATCH', '/v1/auth/me', { body: { walletAddress: lower } }), 'unauthorized')
    const agent = await createAgent(ctx, alice)
    expectError(await ctx.call('PATCH', '/v1/auth/me', { apiKey: agent.apiKey, body: { walletAddress: lower } }), 403, 'forbidden')
  })
})

describe('user API keys', () => {
  test('creating one returns 201 with a one-time sk_usr_ key that acts as its user', async () => {
    const res = await ctx.call('POST', '/v1/auth/api-keys', { token: alice.token, body: { name: 'ci' } })
    expect(res.status).toBe(201)
    expect(res.body.success).toBe(true)
    expect(Object.keys(res.body.data).sort()).toEqual(['createdAt', 'id', 'key', 'name'])
    expect(res.body.data).toMatchObject({ name: 'ci' })
    expect(res.body.data.id).toMatch(uuid)
    expect(res.body.data.key).toMatch(/^sk_usr_[0-9A-Za-z]{38}$/)
    expect(res.body.data.createdAt).toMatch(isoMs)

    const me = await ctx.call('GET', '/v1/auth/me', { token: res.body.data.key })
    expect(me.status).toBe(200)
    expect(me.body.data.id).toBe(alice.id)
  })

  test('the list shows the prefix and never the key', async () => {
    const user = await signUp(ctx)
    const first = await createUserKey(user, 'first')
    const second = await createUserKey(user, 'second')
    const res = await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })
    expect(res.status).toBe(200)
    expect(res.body.data).toHaveLength(2)
    for (const created of [first, second]) {
      const listed = res.body.data.find((k: { id: string }) => k.id === created.id)
      expect(listed).toEqual({
        id: created.id,
        name: created.name,
        prefix: created.key.slice(0, 12),
        createdAt: created.createdAt,
        lastUsedAt: null,
      })
    }
    expect(JSON.stringify(res.body)).not.toContain(first.key)
    expect(JSON.stringify(res.body)).not.toContain(second.key)
    // another user's list does not show them
    const others = await ctx.call('GET', '/v1/auth/api-keys', { token: bob.token })
    expect(others.body.data.map((k: { id: string }) => k.id)).not.toContain(first.id)
  })

  test('a bad name is 400 validation_failed', async () => {
    for (const body of [{}, { name: '' }, { name: 'x'.repeat(101) }, { name: 'ok', extra: true }]) {
      expectError(await ctx.call('POST', '/v1/auth/api-keys', { token: alice.token, body }), 400, 'validation_failed')
    }
  })

  test('revoking stops the key at once and drops it from the list', async () => {
    const user = await signUp(ctx)
    const created = await createUserKey(user)
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    const res = await ctx.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: user.token })
    expect(res.status).toBe(200)
    expect(res.body.data).toEqual({ id: created.id, revoked: true })
    expect401(await ctx.call('GET', '/v1/auth/me', { token: created.key }), 'invalid_token')
    const list = await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })
    expect(list.body.data).toEqual([])
  })

  test('revoking twice, another user’s key or an unknown id is 404; a non-uuid id is 400', async () => {
    const user = await signUp(ctx)
    const created = await createUserKey(user)
    expectError(await ctx.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: bob.token }), 404, 'not_found')
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    expect((await ctx.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: user.token })).status).toBe(200)
    expectError(await ctx.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: user.token }), 404, 'not_found')
    expectError(await ctx.call('DELETE', '/v1/auth/api-keys/00000000-0000-4000-8000-000000000000', { token: user.token }), 404, 'not_found')
    expectError(await ctx.call('DELETE', '/v1/auth/api-keys/not-a-uuid', { token: user.token }), 400, 'validation_failed')
  })

  test('an agent’s key cannot revoke its owner’s user key', async () => {
    const agent = await createAgent(ctx, alice)
    const created = await createUserKey(alice)
    expectError(await ctx.call('DELETE', `/v1/auth/api-keys/${created.id}`, { apiKey: agent.apiKey }), 403, 'forbidden')
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
  })

  test('an agent key on /v1/auth/me is 403 forbidden, as bearer or X-API-Key', async () => {
    const agent = await createAgent(ctx, alice)
    expectError(await ctx.call('GET', '/v1/auth/me', { token: agent.apiKey }), 403, 'forbidden')
    expectError(await ctx.call('GET', '/v1/auth/me', { apiKey: agent.apiKey }), 403, 'forbidden')
  })

  test('a user key in X-API-Key is 401 invalid_token', async () => {
    const created = await createUserKey(alice)
    expect401(await ctx.call('GET', '/v1/auth/me', { apiKey: created.key }), 'invalid_token')
  })

  test('a key with a corrupted checksum or an unknown key is 401 invalid_token', async () => {
    const created = await createUserKey(alice)
    expect401(await ctx.call('GET', '/v1/auth/me', { token: corrupt(created.key) }), 'invalid_token')
    const agent = await createAgent(ctx, alice)
    expect401(await ctx.call('GET', '/v1/auth/me', { apiKey: corrupt(agent.apiKey) }), 'invalid_token')
    expect401(await ctx.call('GET', '/v1/auth/me', { token: `sk_usr_${'a'.repeat(38)}` }), 'invalid_token')
    expect401(await ctx.call('GET', '/v1/auth/me', { token: created.key.slice(0, -1) }), 'invalid_token')
    // the original is untouched by the failed attempts
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
  })

  test('using a key records lastUsedAt once usage is flushed', async () => {
    const user = await signUp(ctx)
    const created = await createUserKey(user)
    const before = await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })
    expect(before.body.data[0].lastUsedAt).toBeNull()
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    await ctx.deps.authenticator.keys.flushUsage()
    const after = await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })
    expect(after.body.data[0].id).toBe(created.id)
    expect(after.body.data[0].lastUsedAt).toMatch(isoMs)
    expect(Date.parse(after.body.data[0].lastUsedAt)).toBeGreaterThanOrEqual(Date.parse(created.createdAt))
  })

  test('a key used again after a flush has its lastUsedAt moved on by the next flush', async () => {
    const user = await signUp(ctx)
    const created = await createUserKey(user)
    const lastUsedAt = async () => (await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })).body.data[0].lastUsedAt as string
    // Twice: the second use is answered from the key cache, as every later one is.
    for (let i = 0; i < 2; i++) expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    await ctx.deps.authenticator.keys.flushUsage()
    const first = await lastUsedAt()
    ctx.clock.advance(60_000)
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    await ctx.deps.authenticator.keys.flushUsage()
    expect(Date.parse(await lastUsedAt())).toBeGreaterThanOrEqual(Date.parse(first) + 60_000)
  })

  test('a flush within a minute of the row’s last write leaves it, as another process’s would', async () => {
    const user = await signUp(ctx)
    const created = await createUserKey(user)
    const lastUsedAt = async () => (await ctx.call('GET', '/v1/auth/api-keys', { token: user.token })).body.data[0].lastUsedAt as string
    expect((await ctx.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    await ctx.deps.authenticator.keys.flushUsage()
    const first = await lastUsedAt()
    // Another process's flush of the same key, 59 s and then 60 s after this one's.
    await touchKeys(ctx.deps.sql, [created.id], new Date(Date.parse(first) + 59_000), 60_000)
    expect(await lastUsedAt()).toBe(first)
    await touchKeys(ctx.deps.sql, [created.id], new Date(Date.parse(first) + 60_000), 60_000)
    expect(Date.parse(await lastUsedAt())).toBe(Date.parse(first) + 60_000)
  })
})

describe('key storage', () => {
  test('no issued key is stored in plaintext anywhere; only its SHA-256', async () => {
    const user = await signUp(ctx)
    const userKeys = [await createUserKey(user, 'one'), await createUserKey(user, 'two')]
    const agent = await createAgent(ctx, user)
    const rotated = await ctx.call('POST', `/v1/participants/${agent.id}/api-key`, { token: user.token })
    expect(rotated.status).toBe(201)
    // use each live key once, so any caching or usage tracking has had its chance to write
    for (const { key } of userKeys) expect((await ctx.call('GET', '/v1/auth/me', { token: key })).status).toBe(200)
    expect((await ctx.call('GET', `/v1/participants/${agent.id}`, { apiKey: rotated.body.data.apiKey })).status).toBe(200)
    await ctx.deps.authenticator.keys.flushUsage()

    const issued = [...userKeys.map(k => k.key), agent.apiKey, rotated.body.data.apiKey as string]
    const sql = ctx.deps.sql
    const columns = await sql<{ table: string; column: string; type: string }[]>`
      select table_name as "table", column_name as "column", data_type as "type"
      from information_schema.columns
      where table_schema = 'public'
        and data_type in ('text', 'character varying', 'character', 'bytea', 'json', 'jsonb', 'ARRAY')
      order by table_name, column_name
    `
    expect(columns.map(c => `${c.table}.${c.column}`)).toContain('api_keys.key_hash')
    let scanned = 0
    for (const { table, column, type } of columns) {
      const rows = await sql<{ value: unknown }[]>`select ${sql(column)} as value from ${sql(table)}`
      for (const { value } of rows) {
        if (value === null) continue
        scanned++
        const text = type === 'bytea' ? (value as Buffer).toString('latin1') : typeof value === 'string' ? value : JSON.stringify(value)
        for (const key of issued) expect(text.includes(key), `${table}.${column} holds an issued key`).toBe(false)
      }
    }
    expect(scanned).toBeGreaterThan(0)

    // and nothing under this test's Redis prefix holds one either
    const redis = ctx.deps.redis
    let cursor = '0'
    do {
      const [next, names] = await redis.scan(cursor, 'MATCH', `${ctx.config.redisPrefix}*`, 'COUNT', 1000)
      cursor = next
      for (const name of names) {
        const type = await redis.type(name)
        const value = type === 'string' ? await redis.get(name) : type === 'hash' ? JSON.stringify(await redis.hgetall(name)) : ''
        for (const key of issued) expect((value ?? '').includes(key)).toBe(false)
      }
    } while (cursor !== '0')

    for (const key of issued) {
      const hash = createHash('sha256').update(key).digest()
      const [row] = await sql<{ prefix: string; kind: string }[]>`select prefix, kind from api_keys where key_hash = ${hash}`
      expect(row).toEqual({ prefix: key.slice(0, 12), kind: key.startsWith('sk_usr_') ? 'user' : 'agent' })
    }
    const [stored] = await sql<{ keyHash: Buffer }[]>`select key_hash as "keyHash" from api_keys where id = ${userKeys[0]!.id}`
    expect(stored!.keyHash.toString('hex')).toBe(createHash('sha256').update(userKeys[0]!.key).digest('hex'))
  })
})

/** Calls `request` (on another instance) until it is refused; returns how long that took, or a time past 1 s. */
async function msUntilRefused(request: () => Promise<CallResult>): Promise<number> {
  const started = performance.now()
  for (;;) {
    const res = await request()
    const elapsed = performance.now() - started
    if (res.status === 401) {
      expect401(res, 'invalid_token')
      return elapsed
    }
    expect(res.status).toBe(200)
    if (elapsed > 1000) return elapsed
    await Bun.sleep(10)
  }
}

describe('revocation across instances sharing Redis', () => {
  let a: TestContext
  let b: TestContext
  let owner: TestUser

  beforeAll(async () => {
    a = await createTestContext()
    b = await createTestContext({ database: a.database, env: { REDIS_PREFIX: a.config.redisPrefix } })
    owner = await signUp(a)
  })
  afterAll(async () => {
    await b.close()
    await a.close()
  })

  test('the instances share one database and one key-revocation channel', () => {
    expect(b.config.databaseUrl).toBe(a.config.databaseUrl)
    expect(b.deps.keys.channels.keyRevoked).toBe(a.deps.keys.channels.keyRevoked)
    expect(b.deps).not.toBe(a.deps)
  })

  test('instance B serves keys from its cache (so the revocation tests below measure propagation)', async () => {
    const created = (await a.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name: 'cached' } })).body.data
    expect((await b.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
    // revoked behind the app's back: no eviction is published, so B still trusts its cached entry
    await a.deps.sql`update api_keys set revoked_at = now() where id = ${created.id}`
    expect((await b.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
  })

  test('a user key revoked on instance A is refused by instance B within 1 s', async () => {
    const created = (await a.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name: 'shared' } })).body.data
    const me = await b.call('GET', '/v1/auth/me', { token: created.key })
    expect(me.status).toBe(200)
    expect(me.body.data.id).toBe(owner.id)

    expect((await a.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: owner.token })).status).toBe(200)
    const elapsed = await msUntilRefused(() => b.call('GET', '/v1/auth/me', { token: created.key }))
    expect(elapsed).toBeLessThan(1000)
  })

  test('an agent key rotated on instance A is refused by instance B within 1 s; the new key works there', async () => {
    const agent = await createAgent(a, owner)
    const path = `/v1/participants/${agent.id}`
    expect((await b.call('GET', path, { apiKey: agent.apiKey })).status).toBe(200)

    const rotated = await a.call('POST', `${path}/api-key`, { token: owner.token })
    expect(rotated.status).toBe(201)
    const elapsed = await msUntilRefused(() => b.call('GET', path, { apiKey: agent.apiKey }))
    expect(elapsed).toBeLessThan(1000)
    expect((await b.call('GET', path, { apiKey: rotated.body.data.apiKey })).status).toBe(200)
  })
})

describe('revocation when Redis cannot take the eviction', () => {
  /** Two instances on one database and one Redis key space; `env` for both. */
  async function pair(env: Record<string, string> = {}) {
    const a = await createTestContext({ env })
    const b = await createTestContext({ database: a.database, env: { ...env, REDIS_PREFIX: a.config.redisPrefix } })
    const owner = await signUp(a)
    const newKey = async (name: string) => (await a.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name } })).body.data
    const outboxEmpty = async () => (await a.deps.sql<{ n: number }[]>`select count(*)::int as n from outbox`)[0]!.n === 0
    return { a, b, owner, newKey, outboxEmpty, close: async () => (await b.close(), await a.close()) }
  }

  test('a key revoked on an instance cut off from Redis is refused by the others within 1 s: the revocation travels through the outbox', async () => {
    const { a, b, owner, newKey, outboxEmpty, close } = await pair()
    try {
      const created = await newKey('cut-off')
      expect((await b.call('GET', '/v1/auth/me', { token: created.key })).status).toBe(200)
      // A's connection for commands closes for good: its publish of the eviction fails, as does its own relay.
      a.deps.redis.disconnect()
      expect(await a.deps.redis.publish(a.deps.keys.channels.keyRevoked, 'probe').catch(() => 'failed')).toBe('failed')

      const revoked = await a.call('DELETE', `/v1/auth/api-keys/${created.id}`, { token: owner.token })
      expect(revoked.status).toBe(200)
      expect(await msUntilRefused(() => b.call('GET', '/v1/auth/me', { token: created.key }))).toBeLessThan(1000)
      await until(outboxEmpty, 5000)
    } finally {
      await close()
    }
  })

  test('while an instance cannot hear evictions it checks every key in Postgres: a key revoked meanwhile is refused at once', async () => {
    const redis = await startRedisServer()
    const { a, b, owner, newKey, outboxEmpty, close } = await pair({ REDIS_URL: redis.url })
    try {
      const [doomed, kept] = [await newKey('doomed'), await newKey('kept')]
      for (const key of [doomed.key, kept.key]) expect((await b.call('GET', '/v1/auth/me', { token: key })).status).toBe(200)

      await redis.down({ keepData: true })
      await until(async () => !b.deps.pubsub.listening(), 5000)
      expect((await a.call('DELETE', `/v1/auth/api-keys/${doomed.id}`, { token: owner.token })).status).toBe(200)
      expect401(await b.call('GET', '/v1/auth/me', { token: doomed.key }), 'invalid_token')
      expect((await b.call('GET', '/v1/auth/me', { token: kept.key })).status).toBe(200)

      await redis.up()
      await until(async () => b.deps.pubsub.listening(), 10_000)
      expect401(await b.call('GET', '/v1/auth/me', { token: doomed.key }), 'invalid_token')
      expect((await b.call('GET', '/v1/auth/me', { token: kept.key })).status).toBe(200)
      await until(outboxEmpty, 10_000)
    } finally {
      await close()
      await redis.close()
    }
  }, 30_000)
})

// Three unknown keys a minute per address, counted behind a proxy at 127.0.0.1; every other limit as the other tests have them.
const limited = { TRUSTED_PROXIES: '127.0.0.1', RATE_LIMITS: JSON.stringify({ apiKeyMisses: { capacity: 3, perSeconds: 60 } }) }

describe('unknown keys per address', () => {
  let c: TestContext
  let server: ReturnType<TestContext['app']['listen']>
  let owner: TestUser

  const logged: string[] = []

  beforeAll(async () => {
    c = await createTestContext({ env: limited, log: createLog('warn', line => logged.push(line)) })
    server = c.app.listen({ port: 0, hostname: '127.0.0.1' })
    owner = await signUp(c)
  })
  afterAll(async () => {
    await server.stop()
    await c.close()
  })

  /** An agent's status, asked with `key` by a client at `address` behind the proxy at 127.0.0.1. */
  const status = (key: string, address: string) =>
    fetch(`http://127.0.0.1:${server.server!.port}/v1/agent/status`, { headers: { 'x-api-key': key, 'x-forwarded-for': address } })
  /** A well-formed key, checksum and all, that was never issued: what anyone can make. */
  const forged = () => generateKey('agent').key

  test('past the rule an address is 429 for keys the process has not seen, valid ones too, with no lookup', async () => {
    const [fresh, cached] = [await createAgent(c, owner), await createAgent(c, owner)]
    expect((await status(cached.apiKey, '203.0.113.10')).status).toBe(200)
    for (let i = 0; i < 3; i++) expect((await status(forged(), '203.0.113.10')).status).toBe(401)
    // The fourth finds the bucket empty; the count is taken after its 401, so the refusal follows it.
    await until(async () => (await status(forged(), '203.0.113.10')).status === 429, 5000)

    const refused = await status(fresh.apiKey, '203.0.113.10')
    expect(refused.status).toBe(429)
    // The operator is told, once, which address.
    const told = logged.map(line => JSON.parse(line)).filter(line => line.msg.startsWith('an address sent too many made-up API keys'))
    expect(told).toEqual([expect.objectContaining({ level: 'warn', address: '203.0.113.10', seconds: 60 })])
    expect(((await refused.json()) as { error: string }).error).toBe('rate_limited')
    const seconds = Number(refused.headers.get('retry-after'))
    expect(seconds).toBeGreaterThan(50)
    expect(seconds).toBeLessThanOrEqual(60)
    // A key the process holds costs nothing, and passes; another address is not refused.
    expect((await status(cached.apiKey, '203.0.113.10')).status).toBe(200)
    expect((await status(forged(), '203.0.113.11')).status).toBe(401)
    expect((await status(fresh.apiKey, '203.0.113.11')).status).toBe(200)

    // Once the window has passed, the address's unknown keys are looked up again.
    c.clock.advance(60_000)
    expect((await status(forged(), '203.0.113.10')).status).toBe(401)
  })

  test('the same unknown key sent again is remembered, not counted again', async () => {
    const key = forged()
    for (let i = 0; i < 10; i++) expect((await status(key, '203.0.113.20')).status).toBe(401)
    const agent = await createAgent(c, owner)
    expect((await status(agent.apiKey, '203.0.113.20')).status).toBe(200)
  })

  test('keys once issued (rotated out, or of a deactivated agent) are refused but not counted: agents polling on with them cost their address nothing', async () => {
    const someone = await signUp(c)
    const stale: string[] = []
    for (let i = 0; i < 4; i++) {
      const agent = await createAgent(c, someone)
      expect((await c.call('POST', `/v1/participants/${agent.id}/api-key`, { token: someone.token })).status).toBe(201)
      stale.push(agent.apiKey)
    }
    const deactivated = await createAgent(c, someone)
    expect((await c.call('DELETE', `/v1/participants/${deactivated.id}`, { token: someone.token })).status).toBe(200)
    stale.push(deactivated.apiKey)
    for (const key of stale) expect((await status(key, '203.0.113.40')).status).toBe(401)
    // Past the rule's three, had they counted; a made-up key still counts, once.
    expect((await status(forged(), '203.0.113.40')).status).toBe(401)
    const agent = await createAgent(c, someone)
    expect((await status(agent.apiKey, '203.0.113.40')).status).toBe(200)
  })

  test('keys with a bad checksum cost no lookup and are not counted', async () => {
    const agent = await createAgent(c, owner)
    for (let i = 0; i < 10; i++) expect((await status(corrupt(forged()), '203.0.113.30')).status).toBe(401)
    expect((await status(agent.apiKey, '203.0.113.30')).status).toBe(200)
  })
})

describe('unknown keys per address while Redis cannot count them', () => {
  test('paused or down, Redis holds no answer back and refuses nothing: keys are looked up in Postgres as before', async () => {
    const redis = await startRedisServer()
    const c = await createTestContext({
      env: { ...limited, REDIS_URL: redis.url },
    })
    const server = c.app.listen({ port: 0, hostname: '127.0.0.1' })
    try {
      const owner = await signUp(c)
      const newKey = async (name: string) =>
        (await c.call('POST', '/v1/auth/api-keys', { token: owner.token, body: { name } })).body.data.key as string
      // Neither has been used: this process has not cached them.
      const [whilePaused, whileDown] = [await newKey('paused'), await newKey('down')]
      /** The caller, asked with `key` by a client at `address` behind the proxy at 127.0.0.1. */
      const me = (key: string, address: string) =>
        fetch(`http://127.0.0.1:${server.server!.port}/v1/auth/me`, { headers: { authorization: `Bearer ${key}`, 'x-forwarded-for': address } })

      // Paused: each count waits on Redis, the answers do not (a wait would end in 503 at the command's
      // timeout). The counts land once it resumes: the next address is another.
      redis.pause()
      try {
        for (let i = 0; i < 6; i++) expect((await me(generateKey('user').key, '203.0.113.40')).status).toBe(401)
        expect((await me(whilePaused, '203.0.113.40')).status).toBe(200)
      } finally {
        redis.resume()
      }

      // Down: nothing is counted, and every key is checked in Postgres (the cache cannot hear evictions).
      await redis.down({ keepData: false })
      await until(async () => !c.deps.pubsub.listening(), 5000)
      for (let i = 0; i < 6; i++) expect((await me(generateKey('user').key, '203.0.113.41')).status).toBe(401)
      expect((await me(whileDown, '203.0.113.41')).status).toBe(200)
    } finally {
      await server.stop()
      await c.close()
      await redis.close()
    }
  }, 60_000)
})
