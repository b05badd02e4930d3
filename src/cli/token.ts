/** `bun run token --sub alice [--email a@b.c] [--ttl 86400]`: prints a JWT the service accepts (HS256). */
import { parseArgs } from 'node:util'
import { SignJWT } from 'jose'
import { loadConfig } from '../config.ts'
import { withDevSecrets } from '../dev-secrets.ts'

const { values } = parseArgs({
  options: {
    sub: { type: 'string' },
    email: { type: 'string' },
    wallet: { type: 'string' },
    ttl: { type: 'string', default: '86400' },
  },
})
if (!values.sub) {
  console.error('usage: bun run token --sub <provider id> [--email <email>] [--wallet <0x...>] [--ttl <seconds>]')
  process.exit(2)
}
const config = withDevSecrets(loadConfig(process.env))
if (!config.auth.jwtSecret) {
  console.error('token: no HS256 secret (AUTH_JWT_SECRET); with a JWKS provider, get tokens from the provider')
  process.exit(1)
}
let jwt = new SignJWT({
  ...(values.email ? { email: values.email } : {}),
  ...(values.wallet ? { wallet_address: values.wallet } : {}),
})
  .setProtectedHeader({ alg: 'HS256' })
  .setSubject(values.sub)
  .setIssuedAt()
  .setExpirationTime(`${Number(values.ttl)}s`)
if (config.auth.issuer) jwt = jwt.setIssuer(config.auth.issuer)
if (config.auth.audience) jwt = jwt.setAudience(config.auth.audience)
console.log(await jwt.sign(new TextEncoder().encode(config.auth.jwtSecret)))
