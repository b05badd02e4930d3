/** `bun run token --sub alice [--email a@b.c] [--ttl 3600]`: prints a JWT the service accepts (HS256). */
import { SignJWT } from 'jose'
import { loadConfig } from '../config.ts'
import { withDevSecrets } from '../dev-secrets.ts'
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
  const issuedAt = Math.floor(Date.now() / 1000)
  let jwt = new SignJWT({
    ...(values.email ? { email: values.email } : {}),
    ...(values.wallet ? { wallet_address: values.wallet } : {}),
  })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(values.sub)
    .setIssuedAt(issuedAt)
    .setExpirationTime(issuedAt + ttl)
  if (config.auth.issuer) jwt = jwt.setIssuer(config.auth.issuer)
  if (config.auth.audience) jwt = jwt.setAudience(config.auth.audience)
  console.log(await jwt.sign(new TextEncoder().encode(config.auth.jwtSecret)))
})
