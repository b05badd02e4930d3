/** `bun run token --sub alice [--email a@b.c] [--ttl 3600]`: prints a JWT the service accepts (HS256). */
import { SignJWT } from 'jose'
import { loadConfig } from '../config.ts'
import { withDevSecrets } from '../dev-secrets.ts'
import { claimsOf, type TokenClaims } from '../auth/jwt.ts'
import { runCli, UsageError } from './run.ts'

const usage = 'usage: npm run -s token -- --sub <provider id> [--email <email>] [--wallet <0x...>] [--ttl <seconds, at most AUTH_MAX_TOKEN_AGE>]'
const options = { sub: { type: 'string' }, email: { type: 'string' }, wallet: { type: 'string' }, ttl: { type: 'string' } } as const

await runCli('token', usage, options, async values => {
  if (!values.sub) throw new UsageError('--sub is required (--help shows the usage)')
  const config = withDevSecrets(loadConfig(process.env))
  if (!config.auth.jwtSecret) throw new Error('no HS256 secret (AUTH_JWT_SECRET); with a JWKS provider, get tokens from the provider')
  // The service refuses a token that lives longer than AUTH_MAX_TOKEN_AGE: that is the default and the most.
  const maxTtl = config.auth.maxTokenAgeSeconds
  const ttl = values.ttl === undefined ? maxTtl : /^[0-9]+$/.test(values.ttl) ? Number(values.ttl) : NaN
  if (!(ttl >= 1 && ttl <= maxTtl)) throw new UsageError(`--ttl must be whole seconds from 1 to ${maxTtl} (AUTH_MAX_TOKEN_AGE)`)
  const claims = { ...(values.email ? { email: values.email } : {}), ...(values.wallet ? { wallet_address: values.wallet } : {}) }
  refuseWhatTheServiceWould({ sub: values.sub, ...claims })
  const issuedAt = Math.floor(Date.now() / 1000)
  let jwt = new SignJWT(claims)
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(values.sub)
    .setIssuedAt(issuedAt)
    .setExpirationTime(issuedAt + ttl)
  if (config.auth.issuer) jwt = jwt.setIssuer(config.auth.issuer)
  if (config.auth.audience) jwt = jwt.setAudience(config.auth.audience)
  console.log(await jwt.sign(new TextEncoder().encode(config.auth.jwtSecret)))
})

/** A token the service would refuse (its subject), or whose --email or --wallet it would ignore, is not signed. */
function refuseWhatTheServiceWould(payload: { sub: string; email?: string; wallet_address?: string }) {
  let read: TokenClaims
  try {
    read = claimsOf(payload)
  } catch {
    throw new UsageError('--sub must be 1 to 255 characters, with no NUL character')
  }
  if (payload.email !== undefined && read.email === null) throw new UsageError('--email must be at most 320 characters, with no NUL character')
  if (payload.wallet_address !== undefined && read.walletAddress === null) {
    throw new UsageError('--wallet must be 0x and 40 hexadecimal digits (a mixed-case one with its EIP-55 checksum)')
  }
}
