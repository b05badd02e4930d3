/** Configuration: the only reader of the environment, validated once at boot. */
import { mkdirSync } from 'node:fs'
import { isIP } from 'node:net'
import { Type as T, type Static } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { trustedProxyList } from './http/client-ip.ts'
import { originList } from './http/cors.ts'
import { defaultTimeouts, type MigrationTimeouts } from './migrate.ts'
import { firstLine } from './text.ts'

/**
 * The longest a timer can wait (2^31 - 1 ms, 24.8 days): a longer setTimeout fires after 1 ms (a
 * shutdown that gave up at once, BullMQ's stalled-job check run in a loop), and Postgres refuses a
 * longer lock_timeout or statement_timeout. Every variable in milliseconds stops there.
 */
const maxTimerMs = 2_147_483_647

const Env = T.Object({
  PORT: T.Integer({ minimum: 0, maximum: 65535, default: 3000 }),
  DATABASE_URL: T.Optional(T.String({ pattern: '^postgres(ql)?://', expected: 'a postgres:// or postgresql:// URL' })),
  REDIS_URL: T.String({ pattern: '^rediss?://', default: 'redis://127.0.0.1:6379', expected: 'a redis:// or rediss:// URL' }),
  REDIS_PREFIX: T.String({ pattern: '^[A-Za-z0-9:_.-]{0,64}$', default: 'am:', expected: 'at most 64 letters, digits and : _ . -' }),
  SITE_URL: T.Optional(T.String({ pattern: '^https?://[^\\s]+$', expected: 'an http:// or https:// URL without spaces' })),
  AUTH_JWT_SECRET: T.Optional(T.String({ minLength: 32 })),
  AUTH_JWT_SECRET_PREVIOUS: T.Optional(T.String({ minLength: 32 })),
  AUTH_JWKS_URL: T.Optional(T.String({ pattern: '^https?://', expected: 'an http:// or https:// URL' })),
  AUTH_ISSUER: T.Optional(T.String({ minLength: 1 })),
  AUTH_AUDIENCE: T.Optional(T.String({ minLength: 1 })),
  AUTH_MAX_TOKEN_AGE: T.Integer({ minimum: 60, default: 86_400 }),
  CONNECTIONS_KEY: T.Optional(T.String({ pattern: '^([0-9a-fA-F]{64}|[A-Za-z0-9+/]{43}=)$', expected: '64 hex digits, or 32 bytes in base64' })),
  CONNECTIONS_KEY_PREVIOUS: T.Optional(
    T.String({ pattern: '^([0-9a-fA-F]{64}|[A-Za-z0-9+/]{43}=)$', expected: '64 hex digits, or 32 bytes in base64' }),
  ),
  PROXY_ALLOWED_HOSTS: T.String({ default: '' }),
  TRUSTED_PROXIES: T.String({ default: '' }),
  CORS_ORIGINS: T.String({ default: '' }),
  NODE_ENV: T.Union([T.Literal('development'), T.Literal('production'), T.Literal('test')], {
    default: 'development',
  }),
  DATA_DIR: T.String({ minLength: 1, default: '.data' }),
  LOG_LEVEL: T.Union([T.Literal('debug'), T.Literal('info'), T.Literal('warn'), T.Literal('error')], {
    default: 'info',
  }),
  RATE_LIMITS: T.String({ default: '{}' }),
  // Past the longest a request may take (10 s: an actor's answer, a proxy call's upstream), so a drain
  // answers every request it let in, even while no workers run.
  SHUTDOWN_TIMEOUT_MS: T.Integer({ minimum: 1, maximum: maxTimerMs, default: 15000 }),
  SHUTDOWN_DELAY_MS: T.Integer({ minimum: 0, maximum: maxTimerMs, default: 0 }),
  // Past the 60 s for which nginx's upstream keep-alive and AWS's load balancers keep an idle
  // connection to reuse: the one that closes an idle connection must be the one that reuses it, or a
  // request it sends as the service closes is lost (502). Bun takes at most 255 (0: never).
  HTTP_IDLE_TIMEOUT_S: T.Integer({ minimum: 0, maximum: 255, default: 75 }),
  INVOICE_EVERY_MS: T.Integer({ minimum: 1000, maximum: maxTimerMs, default: 3_600_000 }),
  QUEUE_LOCK_MS: T.Integer({ minimum: 1000, maximum: maxTimerMs, default: 30_000 }),
  SERVICE_REQUESTS_OPEN_MAX: T.Integer({ minimum: 1, default: 100 }),
  SERVICE_REQUESTS_OPEN_BYTES: T.Integer({ minimum: 1024, default: 1_048_576 }),
  PROXY_IN_FLIGHT_PER_AGENT: T.Integer({ minimum: 1, default: 10 }),
  CHAT_STREAMS_PER_ADDRESS: T.Integer({ minimum: 0, default: 100 }),
  PROXY_BUFFER_BYTES: T.Integer({ minimum: 1_048_576, default: 67_108_864 }),
  METRICS_PORT: T.Optional(T.Integer({ minimum: 1, maximum: 65535 })),
  METRICS_TOKEN: T.Optional(T.String({ minLength: 32, pattern: '^[\\x21-\\x7e]+$', expected: '32 or more printable ASCII characters, no spaces' })),
  METRICS_TOKEN_PREVIOUS: T.Optional(
    T.String({ minLength: 32, pattern: '^[\\x21-\\x7e]+$', expected: '32 or more printable ASCII characters, no spaces' }),
  ),
  // Postgres refuses every connection given more than maxTimerMs.
  DATABASE_STATEMENT_TIMEOUT_MS: T.Integer({ minimum: 0, maximum: maxTimerMs, default: 30_000 }),
  DATABASE_LOCK_TIMEOUT_MS: T.Integer({ minimum: 0, maximum: maxTimerMs, default: 2000 }),
  DATABASE_POOL_MAX: T.Integer({ minimum: 1, maximum: 1000, default: 20 }),
  MIGRATION_LOCK_TIMEOUT_MS: T.Integer({ minimum: 0, maximum: maxTimerMs, default: defaultTimeouts.lockTimeoutMs }),
  MIGRATION_STATEMENT_TIMEOUT_MS: T.Integer({ minimum: 0, maximum: maxTimerMs, default: defaultTimeouts.statementTimeoutMs }),
})

const RateRule = T.Object(
  {
    capacity: T.Integer({ minimum: 1 }),
    perSeconds: T.Number({ exclusiveMinimum: 0 }),
  },
  { additionalProperties: false },
)
export type RateRule = Static<typeof RateRule>

/** The limits every rate-limited action gets unless RATE_LIMITS overrides them. */
export const defaultRateLimits = {
  deviceCodeCreate: { capacity: 10, perSeconds: 60 },
  // polls of device codes from one address: a device polls every 5 s, so a few devices at once behind one address
  deviceCodePoll: { capacity: 60, perSeconds: 60 },
  deviceCodeApprove: { capacity: 30, perSeconds: 60 },
  deviceCodeMisses: { capacity: 10, perSeconds: 3600 },
  // well-formed API keys one address sends that were never issued (each costs a query; revoked ones
  // are not counted); past it, keys a process has not cached are 429 for the window
  apiKeyMisses: { capacity: 100, perSeconds: 60 },
  apiKeyCreate: { capacity: 20, perSeconds: 3600 },
  participantCreate: { capacity: 20, perSeconds: 3600 },
  chatPost: { capacity: 10, perSeconds: 60 },
  // posts one agent may create, refilled evenly over 24 h
  blogPostCreate: { capacity: 50, perSeconds: 86_400 },
  // edits of posts' content (each rendered again) one agent may make, refilled over an hour
  blogContentEdit: { capacity: 60, perSeconds: 3600 },
  // replies one agent may write (to all its users): 10 a second, with bursts of 600
  replyPost: { capacity: 600, perSeconds: 60 },
  // service requests one agent may send (to any agents), up to 50,000 characters each
  serviceRequestCreate: { capacity: 30, perSeconds: 60 },
  // messages one user may write to agents they subscribe to
  messagePost: { capacity: 30, perSeconds: 60 },
  // proxy calls one agent may make (for all its subscribers)
  proxyCall: { capacity: 600, perSeconds: 60 },
  // context versions one user or agent may write or revert (each is kept for good)
  contextWrite: { capacity: 120, perSeconds: 60 },
  // connected accounts one user may add (each kept until deleted)
  connectionCreate: { capacity: 20, perSeconds: 3600 },
  // plans one owner may create or change (each change is kept, and told to every subscriber)
  planWrite: { capacity: 60, perSeconds: 3600 },
  // config listings one user may create or change (each up to a million characters, kept for good)
  configWrite: { capacity: 60, perSeconds: 3600 },
  // subscriptions one user may start (each kept for good, its period invoiced, told to the agent's owner)
  subscriptionCreate: { capacity: 30, perSeconds: 3600 },
  // reviews one user may write or change (each locks the agent's row and is told to its owner)
  reviewWrite: { capacity: 30, perSeconds: 3600 },
  // reactions one user or agent may add or take back (each a write to another's post, its counts read again)
  reactionWrite: { capacity: 60, perSeconds: 60 },
  // config purchases one user may make, again or not (each answer, content and all, is kept 24 h for replays)
  configPurchase: { capacity: 30, perSeconds: 3600 },
  // stream tokens one user may ask for (each lives 60 s in Redis)
  sseTokenCreate: { capacity: 60, perSeconds: 60 },
  // events replayed to one user's notification streams as they resume (`Last-Event-ID`): 5 whole
  // replays (the 1,000 events a stream keeps, up to 40 MB), refilled over 10 minutes
  streamReplay: { capacity: 5000, perSeconds: 600 },
  // events replayed to one address's world-chat streams as they resume (anonymous): 10 whole
  // replays (about 5 MB), refilled over 10 minutes
  chatReplay: { capacity: 10_000, perSeconds: 600 },
} satisfies Record<string, RateRule>
export type RateLimitName = keyof typeof defaultRateLimits
export type RateLimits = Record<RateLimitName, RateRule>

const RateLimitsOverride = T.Partial(
  T.Object(Object.fromEntries(Object.keys(defaultRateLimits).map(name => [name, RateRule])) as Record<RateLimitName, typeof RateRule>, {
    additionalProperties: false,
  }),
)

export type NodeEnv = 'development' | 'production' | 'test'

export interface Config {
  port: number
  databaseUrl: string | undefined
  redisUrl: string
  redisPrefix: string
  siteUrl: string
  auth: {
    /** The HS256 secret: verifies tokens, and signs the `token` CLI's. */
    jwtSecret: string | undefined
    /** A secret being rotated out: verifies tokens beside `jwtSecret`, never signs. */
    jwtSecretPrevious: string | undefined
    jwksUrl: string | undefined
    issuer: string | undefined
    audience: string | undefined
    /** The longest lifetime (seconds from `iat`, or from now without one, to `exp`) a JWT may have. */
    maxTokenAgeSeconds: number
  }
  /** Seals new credentials, and opens them. */
  connectionsKey: Buffer | undefined
  /** A key being rotated out: opens credentials it sealed (until `connections:reseal` has sealed them again), never seals. */
  connectionsKeyPrevious: Buffer | undefined
  proxyAllowedHosts: string[]
  /** Reverse proxies and load balancers (addresses or CIDR ranges) whose X-Forwarded-For is believed. */
  trustedProxies: string[]
  /** Origins of the pages (a dashboard elsewhere) whose scripts may call the API, or `*` alone for every one; none: no CORS headers. */
  corsOrigins: string[]
  nodeEnv: NodeEnv
  dataDir: string
  logLevel: 'debug' | 'info' | 'warn' | 'error'
  rateLimits: RateLimits
  shutdownTimeoutMs: number
  /** How long a shutdown keeps serving, not ready and closing each connection it answers, before the listener closes. */
  shutdownDelayMs: number
  /** Seconds a kept-alive HTTP connection may sit idle before the API closes it (0: never); longer than any proxy's in front. */
  httpIdleTimeoutS: number
  /** How often the invoice run looks for ended periods. */
  invoiceEveryMs: number
  /** How long a worker's hold on a job lasts; a dead worker's jobs return to the queue after it. */
  queueLockMs: number
  /** What open service requests addressed to one agent may add up to; a sender may hold a quarter of each. */
  serviceRequests: ServiceRequestCaps
  /** World-chat streams one client address may hold open, across processes (0: no limit). */
  chatStreamsPerAddress: number
  proxy: {
    /** Proxy calls one agent may have in flight at once, across every API process. */
    inFlightPerAgent: number
    /** Upstream response bytes one process may hold buffered at once, over all its proxy calls. */
    bufferBytes: number
  }
  /**
   * Where GET /metrics is served: on a port of its own, and/or on the API's port behind a bearer token
   * (`token`, or `tokenPrevious` while the scraper's is rotated).
   */
  metrics: { port: number | undefined; token: string | undefined; tokenPrevious: string | undefined }
  /** How long a statement of a request or a worker may run, lock waits included (0: the database role's setting); the invoice run's have no limit. */
  statementTimeoutMs: number
  /**
   * How long a statement of a request or a worker may wait for a lock (0: the database role's
   * setting); the invoice run's wait as long as the lock is held. Shorter than the statement timeout,
   * so that a table an operator locks holds each pool connection that touches it this long, not that.
   */
  lockTimeoutMs: number
  /** Connections of a process's pool for requests (each process has a few more of its own: docs/operations.md). */
  databasePoolMax: number
  /** The lock_timeout and statement_timeout of each migration (0: none), unless its file sets its own. */
  migrationTimeouts: MigrationTimeouts
}

export interface ServiceRequestCaps {
  /** Open (pending, unexpired) requests. */
  maxOpen: number
  /** Bytes of their inputs as the inbox holds them (JSON strings, UTF-8). */
  maxOpenBytes: number
}

/** A configuration problem worth one line on stderr and a non-zero exit. */
export class ConfigError extends Error {
  override name = 'ConfigError'
}

/**
 * Reads and validates the environment once.
 *
 * @example
 * const config = loadConfig(process.env)
 */
export function loadConfig(env: Record<string, string | undefined>): Config {
  const raw: Record<string, string> = {}
  for (const name of Object.keys(Env.properties)) {
    const value = env[name]
    if (value !== undefined && value !== '') raw[name] = value
  }
  // Value.Convert would read "3000.5" as 3000, "1e3" as 1 and "true" as 1: integers are digits or refused.
  for (const [name, schema] of Object.entries(Env.properties)) {
    if (schema.type === 'integer' && raw[name] !== undefined && !/^[0-9]+$/.test(raw[name])) {
      throw new ConfigError(`invalid ${name}: ${expectation(name)}`)
    }
  }
  const converted = Value.Convert(Env, Value.Default(Env, raw))
  const firstError = Value.Errors(Env, converted).First()
  if (firstError) {
    const name = firstError.path.replace(/^\//, '')
    throw new ConfigError(`invalid ${name}: ${expectation(name) ?? firstError.message}`)
  }
  const e = converted as Static<typeof Env>
  // A password written as it is: the drivers' decoding then fails as "URI error", naming nothing.
  for (const name of ['DATABASE_URL', 'REDIS_URL'] as const) {
    if (/%(?![0-9A-Fa-f]{2})/.test(e[name] ?? '')) {
      throw new ConfigError(
        `invalid ${name}: a % not followed by two hex digits; percent-encode its user and password (% as %25, @ %40, : %3A, / %2F, # %23, ? %3F)`,
      )
    }
  }
  const redisProblem = redisUrlProblem(e.REDIS_URL)
  if (redisProblem) throw new ConfigError(`invalid REDIS_URL: ${redisProblem}`)

  let overrides: unknown
  try {
    overrides = JSON.parse(e.RATE_LIMITS)
  } catch {
    throw new ConfigError('invalid RATE_LIMITS: not JSON')
  }
  const overrideError = Value.Errors(RateLimitsOverride, overrides).First()
  if (overrideError) throw new ConfigError(`invalid RATE_LIMITS${overrideError.path}: ${overrideError.message}`)

  const trustedProxies = e.TRUSTED_PROXIES.split(',')
    .map(entry => entry.trim())
    .filter(Boolean)
  try {
    trustedProxyList(trustedProxies)
  } catch (error) {
    throw new ConfigError(`invalid TRUSTED_PROXIES: ${(error as Error).message}`)
  }

  let corsOrigins: string[]
  try {
    corsOrigins = originList(
      e.CORS_ORIGINS.split(',')
        .map(entry => entry.trim())
        .filter(Boolean),
    )
  } catch (error) {
    throw new ConfigError(`invalid CORS_ORIGINS: ${(error as Error).message}`)
  }

  const proxyAllowedHosts = e.PROXY_ALLOWED_HOSTS.split(',')
    .map(host => host.trim().toLowerCase())
    .filter(Boolean)
  const notHost = proxyAllowedHosts.find(entry => !isHostEntry(entry))
  if (notHost !== undefined) {
    throw new ConfigError(`invalid PROXY_ALLOWED_HOSTS: ${notHost} is not a host (a name, an address, or either with :port; comma-separated)`)
  }
  const allowedHosts = proxyAllowedHosts.map(canonicalHostEntry)

  if (e.SHUTDOWN_DELAY_MS >= e.SHUTDOWN_TIMEOUT_MS) {
    throw new ConfigError(`invalid SHUTDOWN_DELAY_MS: must be less than SHUTDOWN_TIMEOUT_MS (${e.SHUTDOWN_TIMEOUT_MS}), which counts it`)
  }

  // A previous secret or key only ever verifies or opens beside the current one, which alone signs or seals.
  for (const [previous, current] of [
    ['AUTH_JWT_SECRET_PREVIOUS', 'AUTH_JWT_SECRET'],
    ['CONNECTIONS_KEY_PREVIOUS', 'CONNECTIONS_KEY'],
    ['METRICS_TOKEN_PREVIOUS', 'METRICS_TOKEN'],
  ] as const) {
    if (e[previous] !== undefined && e[current] === undefined) {
      throw new ConfigError(`invalid ${previous}: it is accepted beside ${current} during a rotation, so ${current} must be set too`)
    }
  }

  const auth = {
    jwtSecret: e.AUTH_JWT_SECRET,
    jwtSecretPrevious: e.AUTH_JWT_SECRET_PREVIOUS,
    jwksUrl: e.AUTH_JWKS_URL,
    issuer: e.AUTH_ISSUER,
    audience: e.AUTH_AUDIENCE,
    maxTokenAgeSeconds: e.AUTH_MAX_TOKEN_AGE,
  }
  if (e.NODE_ENV === 'production') {
    // Every one missing, in one line: not found one boot at a time.
    const missing = [
      !auth.jwtSecret && !auth.jwksUrl && 'AUTH_JWT_SECRET or AUTH_JWKS_URL',
      !e.CONNECTIONS_KEY && 'CONNECTIONS_KEY',
      !e.DATABASE_URL && 'DATABASE_URL',
    ].filter(Boolean)
    if (missing.length > 0) throw new ConfigError(`${missing.join(', ')} must be set when NODE_ENV=production`)
  }

  return {
    port: e.PORT,
    databaseUrl: e.DATABASE_URL,
    redisUrl: e.REDIS_URL,
    redisPrefix: e.REDIS_PREFIX,
    siteUrl: (e.SITE_URL ?? `http://localhost:${e.PORT}`).replace(/\/+$/, ''),
    auth,
    connectionsKey: e.CONNECTIONS_KEY ? decodeKey(e.CONNECTIONS_KEY) : undefined,
    connectionsKeyPrevious: e.CONNECTIONS_KEY_PREVIOUS ? decodeKey(e.CONNECTIONS_KEY_PREVIOUS) : undefined,
    proxyAllowedHosts: allowedHosts,
    trustedProxies,
    corsOrigins,
    nodeEnv: e.NODE_ENV,
    dataDir: e.DATA_DIR,
    logLevel: e.LOG_LEVEL,
    rateLimits: { ...defaultRateLimits, ...(overrides as Partial<RateLimits>) },
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_MS,
    shutdownDelayMs: e.SHUTDOWN_DELAY_MS,
    httpIdleTimeoutS: e.HTTP_IDLE_TIMEOUT_S,
    invoiceEveryMs: e.INVOICE_EVERY_MS,
    queueLockMs: e.QUEUE_LOCK_MS,
    serviceRequests: { maxOpen: e.SERVICE_REQUESTS_OPEN_MAX, maxOpenBytes: e.SERVICE_REQUESTS_OPEN_BYTES },
    chatStreamsPerAddress: e.CHAT_STREAMS_PER_ADDRESS,
    proxy: { inFlightPerAgent: e.PROXY_IN_FLIGHT_PER_AGENT, bufferBytes: e.PROXY_BUFFER_BYTES },
    metrics: { port: e.METRICS_PORT, token: e.METRICS_TOKEN, tokenPrevious: e.METRICS_TOKEN_PREVIOUS },
    statementTimeoutMs: e.DATABASE_STATEMENT_TIMEOUT_MS,
    lockTimeoutMs: e.DATABASE_LOCK_TIMEOUT_MS,
    databasePoolMax: e.DATABASE_POOL_MAX,
    migrationTimeouts: { lockTimeoutMs: e.MIGRATION_LOCK_TIMEOUT_MS, statementTimeoutMs: e.MIGRATION_STATEMENT_TIMEOUT_MS },
  }
}

/** What a variable must be, in words: a union's choices, a whole number's range, or the form a pattern stands for. */
function expectation(name: string): string | undefined {
  const schema = (
    Env.properties as Record<string, { expected?: string; anyOf?: { const?: unknown }[]; type?: string; minimum?: number; maximum?: number }>
  )[name]
  if (schema?.anyOf) return `must be one of ${schema.anyOf.map(option => option.const).join(', ')}`
  if (schema?.type === 'integer') {
    const range = schema.maximum === undefined ? ` of at least ${schema.minimum ?? 0}` : ` from ${schema.minimum ?? 0} to ${schema.maximum}`
    return `must be a whole number${range}`
  }
  return schema?.expected && `must be ${schema.expected}`
}

/**
 * Why REDIS_URL cannot be used as meant, or undefined. ioredis reads it with Node's legacy URL parser,
 * which took `redis://host:notaport` for host:6379 and database `notaport` (a DeprecationWarning as
 * text on stderr, then every connection refused its SELECT for ever).
 */
function redisUrlProblem(text: string): string | undefined {
  let url: URL
  try {
    url = new URL(text)
  } catch {
    return 'must be a redis:// or rediss:// URL (its port a number)'
  }
  return /^\/?[0-9]*$/.test(url.pathname) ? undefined : 'its path must be a database number, as in redis://host:6379/0'
}

/**
 * Whether a PROXY_ALLOWED_HOSTS entry is what proxy calls' upstreams are matched against (their
 * host, or host:port): not a URL (`http://host`, `host/path`), which would match nothing, silently.
 */
function isHostEntry(entry: string): boolean {
  if (isIP(entry) === 6) return true
  if (/[/?#@\s]/.test(entry)) return false
  try {
    return new URL(`http://${entry}`).hostname !== ''
  } catch {
    return false
  }
}

/**
 * A PROXY_ALLOWED_HOSTS entry (isHostEntry's) as address-policy.ts compares it with an upstream's URL:
 * the host as a URL writes it (an IPv6 address compressed, `fd00:0::5` as `fd00::5`; a name in
 * punycode), with the port as written, when one is. An IPv6 address alone is without brackets, as the
 * upstream's host is read; one with a port keeps them: `[fd00::5]:8080` unbracketed is another address.
 */
function canonicalHostEntry(entry: string): string {
  if (isIP(entry) === 6) return new URL(`http://[${entry}]`).hostname.slice(1, -1)
  const host = new URL(`http://${entry}`).hostname
  // Taken from the text: a URL drops the scheme's own port (`:80`), which the entry may name.
  const port = /:(\d{1,5})$/.exec(entry)?.[1]
  if (port !== undefined) return `${host}:${Number(port)}`
  return host.replace(/^\[(.*)\]$/, '$1')
}

/** Makes DATA_DIR (and its parents) if missing, or throws one line naming it. */
export function makeDataDir(dir: string): void {
  try {
    mkdirSync(dir, { recursive: true })
  } catch (error) {
    throw new ConfigError(`invalid DATA_DIR: ${dir} cannot be made (${firstLine(error)})`)
  }
}

/** Whether this process serves its metrics anywhere (only then are requests timed). */
export function metricsServed(config: Pick<Config, 'metrics'>): boolean {
  return config.metrics.port !== undefined || config.metrics.token !== undefined
}

function decodeKey(text: string): Buffer {
  return /^[0-9a-fA-F]{64}$/.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64')
}
