import { afterAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync, statSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ConfigError, defaultRateLimits, loadConfig } from '../src/config.ts'
import { withDevSecrets } from '../src/dev-secrets.ts'
import { redactUrl } from '../src/text.ts'

const secret = 'a-production-secret-of-at-least-32-chars'
const production = {
  NODE_ENV: 'production',
  AUTH_JWT_SECRET: secret,
  CONNECTIONS_KEY: randomBytes(32).toString('hex'),
  DATABASE_URL: 'postgres://db.internal/app',
}

function configError(env: Record<string, string | undefined>): ConfigError {
  try {
    loadConfig(env)
  } catch (error) {
    if (error instanceof ConfigError) return error
    throw error
  }
  throw new Error(`expected a ConfigError for ${JSON.stringify(env)}`)
}

describe('loadConfig', () => {
  test('an empty environment gets the documented defaults', () => {
    const config = loadConfig({})
    expect(config).toMatchObject({
      port: 3000,
      databaseUrl: undefined,
      redisUrl: 'redis://127.0.0.1:6379',
      redisPrefix: 'am:',
      siteUrl: 'http://localhost:3000',
      auth: {
        jwtSecret: undefined,
        jwtSecretPrevious: undefined,
        jwksUrl: undefined,
        issuer: undefined,
        audience: undefined,
        maxTokenAgeSeconds: 86_400,
      },
      connectionsKey: undefined,
      connectionsKeyPrevious: undefined,
      proxyAllowedHosts: [],
      trustedProxies: [],
      corsOrigins: [],
      nodeEnv: 'development',
      dataDir: '.data',
      logLevel: 'info',
      rateLimits: defaultRateLimits,
      shutdownTimeoutMs: 15000,
      shutdownDelayMs: 0,
      httpIdleTimeoutS: 75,
      metrics: { port: undefined, token: undefined },
      migrationTimeouts: { lockTimeoutMs: 5000, statementTimeoutMs: 600_000 },
    })
  })

  test('empty strings count as unset', () => {
    expect(loadConfig({ PORT: '', REDIS_URL: '', NODE_ENV: '' })).toMatchObject({
      port: 3000,
      redisUrl: 'redis://127.0.0.1:6379',
      nodeEnv: 'development',
    })
  })

  test('SITE_URL follows PORT by default and loses a trailing slash', () => {
    expect(loadConfig({ PORT: '8080' }).siteUrl).toBe('http://localhost:8080')
    expect(loadConfig({ SITE_URL: 'https://market.example.com/' }).siteUrl).toBe('https://market.example.com')
  })

  test.each(['abc', '70000', '-1', '3000.5', '1e3', 'true', '0x50'])('refuses PORT=%p with a ConfigError naming PORT', port => {
    expect(configError({ PORT: port }).message).toContain('PORT')
  })

  test('SHUTDOWN_TIMEOUT_MS is a whole number of milliseconds', () => {
    expect(loadConfig({ SHUTDOWN_TIMEOUT_MS: '2500' }).shutdownTimeoutMs).toBe(2500)
    expect(configError({ SHUTDOWN_TIMEOUT_MS: '1.5' }).message).toContain('SHUTDOWN_TIMEOUT_MS')
    // 0 would end every shutdown at once, with no drain (elsewhere 0 means no limit): refused.
    expect(configError({ SHUTDOWN_TIMEOUT_MS: '0' }).message).toContain('SHUTDOWN_TIMEOUT_MS')
  })

  test('HTTP_IDLE_TIMEOUT_S is 0 to 255 whole seconds (Bun takes no more), by default past the 60 s proxies keep connections', () => {
    expect(loadConfig({ HTTP_IDLE_TIMEOUT_S: '0' }).httpIdleTimeoutS).toBe(0)
    expect(loadConfig({ HTTP_IDLE_TIMEOUT_S: '255' }).httpIdleTimeoutS).toBe(255)
    expect(configError({ HTTP_IDLE_TIMEOUT_S: '256' }).message).toContain('HTTP_IDLE_TIMEOUT_S')
    expect(configError({ HTTP_IDLE_TIMEOUT_S: '1.5' }).message).toContain('HTTP_IDLE_TIMEOUT_S')
  })

  test('SHUTDOWN_DELAY_MS is 0 or more milliseconds, less than SHUTDOWN_TIMEOUT_MS, which counts it', () => {
    expect(loadConfig({ SHUTDOWN_DELAY_MS: '5000', SHUTDOWN_TIMEOUT_MS: '15000' }).shutdownDelayMs).toBe(5000)
    expect(configError({ SHUTDOWN_DELAY_MS: '-1' }).message).toContain('SHUTDOWN_DELAY_MS')
    // As long as the timeout, the drain could never begin before the process gave up on it.
    expect(configError({ SHUTDOWN_DELAY_MS: '15000' }).message).toBe(
      'invalid SHUTDOWN_DELAY_MS: must be less than SHUTDOWN_TIMEOUT_MS (15000), which counts it',
    )
  })

  test('milliseconds stop at 2^31 - 1, past which a timer fires at once and Postgres refuses a timeout', () => {
    const timers = [
      'SHUTDOWN_TIMEOUT_MS',
      'SHUTDOWN_DELAY_MS',
      'INVOICE_EVERY_MS',
      'QUEUE_LOCK_MS',
      'MIGRATION_LOCK_TIMEOUT_MS',
      'MIGRATION_STATEMENT_TIMEOUT_MS',
      'DATABASE_LOCK_TIMEOUT_MS',
    ]
    for (const name of timers) {
      expect(configError({ SHUTDOWN_TIMEOUT_MS: '2147483647', [name]: '2147483648' }).message).toBe(
        `invalid ${name}: must be a whole number from ${name === 'INVOICE_EVERY_MS' || name === 'QUEUE_LOCK_MS' ? 1000 : name === 'SHUTDOWN_TIMEOUT_MS' ? 1 : 0} to 2147483647`,
      )
    }
    expect(loadConfig({ SHUTDOWN_TIMEOUT_MS: '2147483647', QUEUE_LOCK_MS: '2147483647' }).queueLockMs).toBe(2_147_483_647)
  })

  test('METRICS_PORT and METRICS_TOKEN say where metrics are served; a short token or a bad port is refused', () => {
    const token = 'm'.repeat(32)
    expect(loadConfig({ METRICS_PORT: '9464', METRICS_TOKEN: token }).metrics).toEqual({ port: 9464, token, tokenPrevious: undefined })
    expect(configError({ METRICS_TOKEN: 'short' }).message).toContain('METRICS_TOKEN')
    expect(configError({ METRICS_TOKEN: `${'m'.repeat(32)} x` }).message).toContain('METRICS_TOKEN')
    expect(configError({ METRICS_PORT: '0' }).message).toContain('METRICS_PORT')
  })

  test('migration timeouts are whole milliseconds, 0 for none', () => {
    expect(loadConfig({ MIGRATION_LOCK_TIMEOUT_MS: '0', MIGRATION_STATEMENT_TIMEOUT_MS: '60000' }).migrationTimeouts).toEqual({
      lockTimeoutMs: 0,
      statementTimeoutMs: 60_000,
    })
    expect(configError({ MIGRATION_LOCK_TIMEOUT_MS: '5s' }).message).toContain('MIGRATION_LOCK_TIMEOUT_MS')
  })

  test('DATABASE_POOL_MAX sizes the request pool: 20 by default, 1 to 1000', () => {
    expect(loadConfig({}).databasePoolMax).toBe(20)
    expect(loadConfig({ DATABASE_POOL_MAX: '50' }).databasePoolMax).toBe(50)
    for (const bad of ['0', '1001', '2.5', 'many']) expect(configError({ DATABASE_POOL_MAX: bad }).message).toContain('DATABASE_POOL_MAX')
  })

  test('DATABASE_STATEMENT_TIMEOUT_MS is whole milliseconds, 30 s by default, 0 for the role’s own', () => {
    expect(loadConfig({}).statementTimeoutMs).toBe(30_000)
    expect(loadConfig({ DATABASE_STATEMENT_TIMEOUT_MS: '0' }).statementTimeoutMs).toBe(0)
    expect(configError({ DATABASE_STATEMENT_TIMEOUT_MS: '-1' }).message).toContain('DATABASE_STATEMENT_TIMEOUT_MS')
    expect(configError({ DATABASE_STATEMENT_TIMEOUT_MS: '30s' }).message).toContain('DATABASE_STATEMENT_TIMEOUT_MS')
  })

  test('DATABASE_LOCK_TIMEOUT_MS is whole milliseconds, 2 s by default, 0 for the role’s own', () => {
    expect(loadConfig({}).lockTimeoutMs).toBe(2000)
    expect(loadConfig({ DATABASE_LOCK_TIMEOUT_MS: '0' }).lockTimeoutMs).toBe(0)
    expect(loadConfig({ DATABASE_LOCK_TIMEOUT_MS: '500' }).lockTimeoutMs).toBe(500)
    for (const bad of ['-1', '2s', '1.5']) expect(configError({ DATABASE_LOCK_TIMEOUT_MS: bad }).message).toContain('DATABASE_LOCK_TIMEOUT_MS')
  })

  test('REDIS_URL must parse, with a numeric port and a database number as its path, if any', () => {
    expect(loadConfig({ REDIS_URL: 'rediss://:pw@cache.internal:6380/2' }).redisUrl).toBe('rediss://:pw@cache.internal:6380/2')
    expect(configError({ REDIS_URL: 'redis://127.0.0.1:notaport' }).message).toBe(
      'invalid REDIS_URL: must be a redis:// or rediss:// URL (its port a number)',
    )
    expect(configError({ REDIS_URL: 'redis://127.0.0.1:6379/cache' }).message).toBe(
      'invalid REDIS_URL: its path must be a database number, as in redis://host:6379/0',
    )
  })

  test('a URL whose password is not percent-encoded is refused, naming the variable and not the password', () => {
    // The drivers failed on it as "URI error", which for REDIS_URL named nothing.
    for (const name of ['DATABASE_URL', 'REDIS_URL']) {
      const scheme = name === 'REDIS_URL' ? 'rediss' : 'postgres'
      const message = configError({ [name]: `${scheme}://user:50%off@db.internal:6380/0` }).message
      expect(message).toStartWith(`invalid ${name}: a % not followed by two hex digits; percent-encode its user and password`)
      expect(message).not.toContain('50%off')
      expect(loadConfig({ [name]: `${scheme}://user:50%25off@db.internal:6380/0` })).toBeDefined()
    }
  })

  test('refuses malformed URLs, a short JWT secret and an unknown LOG_LEVEL, naming the variable', () => {
    expect(configError({ DATABASE_URL: 'mysql://x' }).message).toContain('DATABASE_URL')
    expect(configError({ REDIS_URL: 'localhost:6379' }).message).toContain('REDIS_URL')
    expect(configError({ AUTH_JWT_SECRET: 'short' }).message).toContain('AUTH_JWT_SECRET')
    expect(configError({ LOG_LEVEL: 'verbose' }).message).toContain('LOG_LEVEL')
    expect(configError({ CONNECTIONS_KEY: 'not-a-key' }).message).toContain('CONNECTIONS_KEY')
  })

  test('says what a value must be in words: the choices of a union, the form a pattern stands for', () => {
    expect(configError({ NODE_ENV: 'prod' }).message).toBe('invalid NODE_ENV: must be one of development, production, test')
    expect(configError({ LOG_LEVEL: 'INFO' }).message).toBe('invalid LOG_LEVEL: must be one of debug, info, warn, error')
    expect(configError({ CONNECTIONS_KEY: 'abc' }).message).toBe('invalid CONNECTIONS_KEY: must be 64 hex digits, or 32 bytes in base64')
    expect(configError({ REDIS_URL: 'localhost:6379' }).message).toBe('invalid REDIS_URL: must be a redis:// or rediss:// URL')
    expect(configError({ DATABASE_URL: 'mysql://x' }).message).toBe('invalid DATABASE_URL: must be a postgres:// or postgresql:// URL')
    expect(configError({ REDIS_PREFIX: 'a b' }).message).toBe('invalid REDIS_PREFIX: must be at most 64 letters, digits and : _ . -')
    // Whole numbers say their range, whether the text is not a number or the number out of range.
    expect(configError({ INVOICE_EVERY_MS: '5' }).message).toBe('invalid INVOICE_EVERY_MS: must be a whole number from 1000 to 2147483647')
    expect(configError({ SHUTDOWN_TIMEOUT_MS: '-1' }).message).toBe('invalid SHUTDOWN_TIMEOUT_MS: must be a whole number from 1 to 2147483647')
    expect(configError({ PORT: 'abc' }).message).toBe('invalid PORT: must be a whole number from 0 to 65535')
  })

  test('a DATA_DIR that cannot be made is one line naming it', () => {
    let error: Error | undefined
    try {
      withDevSecrets(loadConfig({ DATA_DIR: '/proc/no-such-dir' }))
    } catch (caught) {
      error = caught as Error
    }
    expect(error).toBeInstanceOf(ConfigError)
    expect(error!.message).toStartWith('invalid DATA_DIR: /proc/no-such-dir cannot be made (')
  })

  test('production without AUTH_JWT_SECRET or AUTH_JWKS_URL is refused', () => {
    const error = configError({ ...production, AUTH_JWT_SECRET: undefined })
    expect(error.message).toContain('AUTH_JWT_SECRET')
    expect(error.message).toContain('AUTH_JWKS_URL')
    const withJwks = loadConfig({ ...production, AUTH_JWT_SECRET: undefined, AUTH_JWKS_URL: 'https://id.example.com/jwks' })
    expect(withJwks.auth.jwksUrl).toBe('https://id.example.com/jwks')
  })

  test('production without CONNECTIONS_KEY or DATABASE_URL is refused', () => {
    expect(configError({ ...production, CONNECTIONS_KEY: undefined }).message).toContain('CONNECTIONS_KEY')
    expect(configError({ ...production, DATABASE_URL: undefined }).message).toContain('DATABASE_URL')
    // All that is missing at once, in one line.
    expect(configError({ NODE_ENV: 'production' }).message).toBe(
      'AUTH_JWT_SECRET or AUTH_JWKS_URL, CONNECTIONS_KEY, DATABASE_URL must be set when NODE_ENV=production',
    )
    expect(loadConfig(production).nodeEnv).toBe('production')
  })

  test('CONNECTIONS_KEY decodes from 64 hex digits or base64 to the same 32 bytes', () => {
    const key = randomBytes(32)
    const fromHex = loadConfig({ CONNECTIONS_KEY: key.toString('hex') }).connectionsKey
    const fromUpperHex = loadConfig({ CONNECTIONS_KEY: key.toString('hex').toUpperCase() }).connectionsKey
    const fromBase64 = loadConfig({ CONNECTIONS_KEY: key.toString('base64') }).connectionsKey
    for (const decoded of [fromHex, fromUpperHex, fromBase64]) {
      expect(decoded?.length).toBe(32)
      expect(decoded?.equals(key)).toBe(true)
    }
    expect(configError({ CONNECTIONS_KEY: randomBytes(16).toString('hex') }).message).toContain('CONNECTIONS_KEY')
    expect(configError({ CONNECTIONS_KEY: randomBytes(31).toString('base64') }).message).toContain('CONNECTIONS_KEY')
  })

  test('a _PREVIOUS secret, key or token is read beside its current one only, in the same form', () => {
    const key = randomBytes(32)
    const previous = loadConfig({
      AUTH_JWT_SECRET: secret,
      AUTH_JWT_SECRET_PREVIOUS: 'p'.repeat(32),
      CONNECTIONS_KEY: randomBytes(32).toString('hex'),
      CONNECTIONS_KEY_PREVIOUS: key.toString('base64'),
      METRICS_TOKEN: 'm'.repeat(32),
      METRICS_TOKEN_PREVIOUS: 'n'.repeat(32),
    })
    expect(previous.auth.jwtSecretPrevious).toBe('p'.repeat(32))
    expect(previous.connectionsKeyPrevious?.equals(key)).toBe(true)
    expect(previous.metrics.tokenPrevious).toBe('n'.repeat(32))
    for (const [name, current, value] of [
      ['AUTH_JWT_SECRET_PREVIOUS', 'AUTH_JWT_SECRET', 'p'.repeat(32)],
      ['CONNECTIONS_KEY_PREVIOUS', 'CONNECTIONS_KEY', key.toString('hex')],
      ['METRICS_TOKEN_PREVIOUS', 'METRICS_TOKEN', 'n'.repeat(32)],
    ] as const) {
      expect(configError({ [name]: value }).message).toBe(
        `invalid ${name}: it is accepted beside ${current} during a rotation, so ${current} must be set too`,
      )
    }
    expect(configError({ AUTH_JWT_SECRET: secret, AUTH_JWT_SECRET_PREVIOUS: 'short' }).message).toContain('AUTH_JWT_SECRET_PREVIOUS')
    expect(configError({ CONNECTIONS_KEY: key.toString('hex'), CONNECTIONS_KEY_PREVIOUS: 'ab' }).message).toContain('CONNECTIONS_KEY_PREVIOUS')
  })

  test('AUTH_MAX_TOKEN_AGE is whole seconds, at least 60', () => {
    expect(loadConfig({ AUTH_MAX_TOKEN_AGE: '3600' }).auth.maxTokenAgeSeconds).toBe(3600)
    for (const value of ['59', '0', '1h', '3600.5', '-1']) {
      expect(configError({ AUTH_MAX_TOKEN_AGE: value }).message).toContain('AUTH_MAX_TOKEN_AGE')
    }
  })

  test('PROXY_ALLOWED_HOSTS is split on commas, trimmed, lower-cased, empty entries dropped', () => {
    const config = loadConfig({ PROXY_ALLOWED_HOSTS: ' API.Example.com, localhost ,,10.0.0.5:8080 ,::1, [FD00::5]:8080,' })
    // An IPv6 address with a port keeps its brackets, as in a URL (address-policy.ts); alone it is matched without them.
    expect(config.proxyAllowedHosts).toEqual(['api.example.com', 'localhost', '10.0.0.5:8080', '::1', '[fd00::5]:8080'])
  })

  test('PROXY_ALLOWED_HOSTS refuses an entry that is not a host, which would match no upstream', () => {
    for (const entry of ['http://api.example.com', 'api.example.com/v1', 'user@host', 'host:99999', 'a b', 'host:port']) {
      expect(configError({ PROXY_ALLOWED_HOSTS: `localhost,${entry}` }).message).toBe(
        `invalid PROXY_ALLOWED_HOSTS: ${entry} is not a host (a name, an address, or either with :port; comma-separated)`,
      )
    }
  })

  test('TRUSTED_PROXIES takes addresses and CIDR ranges of both families, split on commas', () => {
    const config = loadConfig({ TRUSTED_PROXIES: ' 10.0.0.0/8, 192.168.1.7 ,,fd00::/8,::1 ' })
    expect(config.trustedProxies).toEqual(['10.0.0.0/8', '192.168.1.7', 'fd00::/8', '::1'])
  })

  test.each([
    'proxy.internal',
    '10.0.0.0/33',
    '10.0.0.0/',
    '10.0.0.0/8/1',
    'fd00::/129',
    '10.0.0.256',
    '10.0.0.0/-1',
    '10.0.0.0/0x8',
    '::ffff:10.0.0.0/8',
  ])('refuses TRUSTED_PROXIES with %p in it, naming it', entry => {
    const message = configError({ TRUSTED_PROXIES: `10.0.0.1, ${entry}` }).message
    expect(message).toContain('TRUSTED_PROXIES')
    expect(message).toContain(entry)
  })

  test('CORS_ORIGINS takes origins as browsers send them, split on commas, or * alone', () => {
    expect(loadConfig({ CORS_ORIGINS: ' https://app.example.com, http://localhost:5173 ,,http://[::1]:8080' }).corsOrigins).toEqual([
      'https://app.example.com',
      'http://localhost:5173',
      'http://[::1]:8080',
    ])
    expect(loadConfig({ CORS_ORIGINS: '*' }).corsOrigins).toEqual(['*'])
  })

  test.each([
    ['https://app.example.com/', 'is not an origin as a browser sends it: https://app.example.com'],
    ['https://App.Example.com', 'is not an origin as a browser sends it: https://app.example.com'],
    ['https://app.example.com:443', 'is not an origin as a browser sends it: https://app.example.com'],
    ['https://app.example.com/dashboard', 'is not an origin as a browser sends it: https://app.example.com'],
    ['app.example.com', 'is not an http:// or https:// origin (scheme://host[:port])'],
    ['null', 'is not an http:// or https:// origin (scheme://host[:port])'],
    ['file:///tmp/page.html', 'is not an http:// or https:// origin (scheme://host[:port])'],
    ['https://*.example.com', 'is a pattern: list each origin (or * alone for every one)'],
  ])('refuses CORS_ORIGINS with %p in it, saying what it must be', (entry, problem) => {
    expect(configError({ CORS_ORIGINS: `https://ok.example.com,${entry}` }).message).toBe(`invalid CORS_ORIGINS: "${entry}" ${problem}`)
  })

  test('refuses * in CORS_ORIGINS beside other origins, which it would make pointless', () => {
    expect(configError({ CORS_ORIGINS: 'https://app.example.com,*' }).message).toBe('invalid CORS_ORIGINS: "*" (every origin) must stand alone')
  })

  test('RATE_LIMITS overrides the named rules and keeps the defaults of the others', () => {
    const config = loadConfig({ RATE_LIMITS: '{"deviceCodeCreate":{"capacity":3,"perSeconds":0.5}}' })
    expect(config.rateLimits).toEqual({ ...defaultRateLimits, deviceCodeCreate: { capacity: 3, perSeconds: 0.5 } })
  })

  test('RATE_LIMITS that is not JSON, names an unknown rule or a bad rule is refused', () => {
    expect(configError({ RATE_LIMITS: '{deviceCodeCreate:' }).message).toContain('RATE_LIMITS')
    expect(configError({ RATE_LIMITS: '{"noSuchRule":{"capacity":1,"perSeconds":1}}' }).message).toContain('RATE_LIMITS')
    expect(configError({ RATE_LIMITS: '{"apiKeyCreate":{"capacity":0,"perSeconds":1}}' }).message).toContain('RATE_LIMITS')
    expect(configError({ RATE_LIMITS: '{"apiKeyCreate":{"capacity":1}}' }).message).toContain('RATE_LIMITS')
    expect(configError({ RATE_LIMITS: '[]' }).message).toContain('RATE_LIMITS')
  })

  test('the budgets of service requests and proxy calls: documented defaults, whole numbers within bounds', () => {
    const config = loadConfig({})
    expect(config.serviceRequests).toEqual({ maxOpen: 100, maxOpenBytes: 1_048_576 })
    expect(config.proxy).toEqual({ inFlightPerAgent: 10, bufferBytes: 64 * 1024 * 1024 })
    expect(config.rateLimits).toMatchObject({
      serviceRequestCreate: { capacity: 30, perSeconds: 60 },
      messagePost: { capacity: 30, perSeconds: 60 },
      proxyCall: { capacity: 600, perSeconds: 60 },
    })
    const narrowed = loadConfig({ SERVICE_REQUESTS_OPEN_MAX: '8', SERVICE_REQUESTS_OPEN_BYTES: '40000', PROXY_IN_FLIGHT_PER_AGENT: '2' })
    expect(narrowed.serviceRequests).toEqual({ maxOpen: 8, maxOpenBytes: 40_000 })
    expect(narrowed.proxy.inFlightPerAgent).toBe(2)
    for (const [name, value] of <[string, string][]>[
      ['SERVICE_REQUESTS_OPEN_MAX', '0'],
      ['SERVICE_REQUESTS_OPEN_BYTES', '1.5'],
      ['PROXY_IN_FLIGHT_PER_AGENT', '-1'],
      // less than one call's answer
      ['PROXY_BUFFER_BYTES', '1000'],
    ]) {
      expect(configError({ [name]: value }).message).toContain(name)
    }
  })

  test('a ConfigError message is one line', () => {
    for (const env of [{ PORT: 'x' }, { RATE_LIMITS: '{' }, { ...production, AUTH_JWT_SECRET: undefined }]) {
      expect(configError(env).message).not.toContain('\n')
    }
  })
})

describe('withDevSecrets', () => {
  const root = mkdtempSync(join(tmpdir(), 'am-config-'))
  afterAll(() => rmSync(root, { recursive: true, force: true }))

  test('creates 0600 secret files once under DATA_DIR and returns the same secrets on the next call', () => {
    const dataDir = join(root, 'first', 'nested')
    const first = withDevSecrets(loadConfig({ DATA_DIR: dataDir }))
    expect(first.auth.jwtSecret).toMatch(/^[0-9a-f]{64}$/)
    expect(first.connectionsKey?.length).toBe(32)
    for (const name of ['dev-jwt-secret', 'dev-connections-key']) {
      const file = join(dataDir, name)
      expect(statSync(file).mode & 0o777).toBe(0o600)
    }
    expect(readFileSync(join(dataDir, 'dev-jwt-secret'), 'utf8').trim()).toBe(first.auth.jwtSecret!)

    const second = withDevSecrets(loadConfig({ DATA_DIR: dataDir }))
    expect(second.auth.jwtSecret).toBe(first.auth.jwtSecret)
    expect(second.connectionsKey?.equals(first.connectionsKey!)).toBe(true)
  })

  test('configured secrets win and no file is written for them', () => {
    const dataDir = join(root, 'configured')
    const key = randomBytes(32)
    const config = withDevSecrets(loadConfig({ DATA_DIR: dataDir, AUTH_JWT_SECRET: secret, CONNECTIONS_KEY: key.toString('hex') }))
    expect(config.auth.jwtSecret).toBe(secret)
    expect(config.connectionsKey?.equals(key)).toBe(true)
    expect(existsSync(join(dataDir, 'dev-jwt-secret'))).toBe(false)
    expect(existsSync(join(dataDir, 'dev-connections-key'))).toBe(false)
  })

  test('a JWKS provider needs no development JWT secret', () => {
    const dataDir = join(root, 'jwks')
    const config = withDevSecrets(loadConfig({ DATA_DIR: dataDir, AUTH_JWKS_URL: 'https://id.example.com/jwks' }))
    expect(config.auth.jwtSecret).toBeUndefined()
    expect(existsSync(join(dataDir, 'dev-jwt-secret'))).toBe(false)
  })

  test('production is left as configured and writes nothing', () => {
    const dataDir = join(root, 'production')
    const config = loadConfig({ ...production, DATA_DIR: dataDir })
    expect(withDevSecrets(config)).toBe(config)
    expect(existsSync(dataDir)).toBe(false)
  })
})

describe('redactUrl', () => {
  test('hides credentials, unencoded ones with / or @ too, and leaves a URL without them alone', () => {
    expect(redactUrl('postgres://u:secret@db.example.com:5432/app')).toBe('postgres://***@db.example.com:5432/app')
    expect(redactUrl('postgres://u:p/w@h/db')).toBe('postgres://***@h/db')
    expect(redactUrl('postgres://u:p@ss@h/db')).toBe('postgres://***@h/db')
    expect(redactUrl('postgres://u:secret@[::1]:5432,[2001:db8::1]/db')).toBe('postgres://***@[::1]:5432,[2001:db8::1]/db')
    expect(redactUrl('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379')
  })
})
