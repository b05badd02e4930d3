/** The dependencies every slice gets through createApp(deps): connections, caches, clock, log. */
import { metricsServed, type Config } from './config.ts'
import { createSql, watchDatabaseIdentity, type DatabaseIdentity, type Sql } from './db.ts'
import { closeRedis, connectRedis, createRedis, type Redis } from './redis.ts'
import { createPubSub, type PubSub } from './pubsub.ts'
import { createKeys, type Keys } from './keys.ts'
import { systemClock, type Clock } from './clock.ts'
import { createLog, type Log } from './log.ts'
import { createJwtVerifier, staleKeysForMs } from './auth/jwt.ts'
import { keptKeySet } from './auth/kept-key-set.ts'
import { createKeyCache } from './auth/key-cache.ts'
import { createAuthenticator, type Authenticator } from './auth/authenticator.ts'
import { createRateLimiter, type RateLimiter } from './rate-limit/token-bucket.ts'
import { createUnknownKeyLimit } from './auth/unknown-keys.ts'
import { clientIpResolver } from './http/client-ip.ts'
import { createInFlightLimiter, type InFlightLimiter } from './rate-limit/in-flight.ts'
import { createBufferBudget, type BufferBudget } from './proxy-calls/buffer-budget.ts'
import { createDispatcher, type Dispatcher } from './actors/dispatcher.ts'
import { createMarkdownRenderer, type MarkdownRenderer } from './blog/render.ts'
import type { ActorKinds } from './actors/types.ts'
import { conversationCommands } from './conversations/commands.ts'
import { serviceRequestCommands } from './service-requests/commands.ts'
import { contextCommands } from './context/commands.ts'
import type { InboxDeps } from './conversations/inbox.ts'
import { createInboxReader, type InboxReader } from './conversations/inbox-reader.ts'
import { createReplyWriter, inboxAfterReply, type ReplyWriter } from './conversations/replies.ts'
import type { RelayEffect } from './events/relay.ts'
import { createQueues, type Queues } from './queues.ts'
import { createEventHub, type EventHub } from './events/hub.ts'
import { createBlogQueue, type BlogQueue } from './blog/queue.ts'
import { createLifecycle, type Lifecycle } from './health/lifecycle.ts'
import { createMetrics, type Metrics } from './metrics/metrics.ts'
import { registerCollectors } from './metrics/collectors.ts'

export interface Deps {
  config: Config
  /** Connections for requests: a statement past DATABASE_STATEMENT_TIMEOUT_MS, or a lock wait past DATABASE_LOCK_TIMEOUT_MS, is given up. */
  sql: Sql
  /** Connections for the workers (jobs, relay, actor runtime), with the requests' statement and lock timeouts. Opened on first use. */
  workerSql: Sql
  /**
   * Connections for the invoice run (the workers' job and the CLI), with no statement or lock timeout:
   * its statements (the first one reads every subscription) grow with the data. Opened on first use.
   */
  invoiceSql: Sql
  /** Which Postgres the pools reach: what was derived from another (a backup restored, a replica promoted) is dropped. */
  database: DatabaseIdentity
  redis: Redis
  pubsub: PubSub
  keys: Keys
  clock: Clock
  log: Log
  authenticator: Authenticator
  rateLimiter: RateLimiter
  /** Limits how many operations of one subject run at once, across processes. */
  inFlight: InFlightLimiter
  /** Upstream answers this process's proxy calls may hold at once. */
  proxyBuffers: BufferBudget
  /** Sends commands to agent and organization actors. */
  dispatcher: Dispatcher
  inboxes: InboxReader
  /** Stores agents' replies, the replies of the moment in one statement. */
  replies: ReplyWriter
  /** Producers of the BullMQ queues. */
  queues: Queues
  /** This process's server-sent event connections. */
  events: EventHub
  /** Enqueues blog publications for the blog worker. */
  blogQueue: BlogQueue
  /** Renders posts' Markdown on a thread of its own, with a time limit. */
  markdown: MarkdownRenderer
  /** The process's Prometheus metrics (served only where configured: config.metrics). */
  metrics: Metrics
  /** Whether the process is shutting down (readiness fails then). */
  lifecycle: Lifecycle
  close(): Promise<void>
}

export interface DepsOptions {
  clock?: Clock
  log?: Log
  /** How long one post's render may take (2 s; tests on a crowded machine give it more). */
  renderTimeoutMs?: number
}

/** Every kind of actor this service has: agents (conversations, service requests) and organizations (context). */
export function actorKinds(deps: InboxDeps & { config: Pick<Config, 'serviceRequests'> }): ActorKinds {
  return {
    agent: { ...conversationCommands(deps), ...serviceRequestCommands(deps, deps.config.serviceRequests) },
    org: contextCommands(),
  }
}

/** What the outbox relay does besides delivering, by event type: a reply's conversation written in its agent's inbox. */
export function relayEffects(deps: InboxDeps): Record<string, RelayEffect> {
  return { 'conversation.reply': inboxAfterReply(deps) }
}

/** The same connections and clients, with statements on the workers' own pool: what the workers run on. */
export function forWorkers(deps: Deps): Deps {
  return { ...deps, sql: deps.workerSql }
}

/** The same connections and clients, with statements on the pool without a timeout: what the invoice run runs on. */
export function forInvoiceRun(deps: Deps): Deps {
  return { ...deps, sql: deps.invoiceSql }
}

/**
 * The settings of the connections that serve requests and the workers: no JIT. A statement the
 * planner prices past `jit_above_cost` was compiled at every run, for longer than it ran: a page of
 * 50 or 100 subscriptions (their missing periods made first: about 13,500 of cost a subscription)
 * took 0.8 to 1.5 s, 95 % of it compiling, where it runs in 20 to 100 ms; every user with 8
 * subscriptions or more paid some of it at each read. Their statements are bounded reads and writes.
 */
export const requestSettings = { jit: 'off' }

/**
 * The reply writer's connections' planner settings (see createDeps). With sequential scans priced
 * out, a plan that still needs one (a catalog query: postgres.js's first on every connection) costs
 * past `jit_above_cost` (before PostgreSQL 18, which counts disabled nodes apart from the cost), and
 * Postgres spent 200 to 300 ms compiling it: a first reply on a new connection (after a restart, or
 * 30 s idle) took that long. Keyed lookups never gain from JIT.
 */
export const replySettings = { ...requestSettings, enable_seqscan: 'off' }

/** Reply statements an API process runs at once. */
const replyBatches = 2

/** Opens every connection the API and workers need; `close` ends them in reverse order. */
export async function createDeps(config: Config, options: DepsOptions = {}): Promise<Deps> {
  if (!config.databaseUrl) throw new Error('createDeps needs a database URL')
  const log = options.log ?? createLog(config.logLevel)
  const clock = options.clock ?? systemClock
  const keys = createKeys(config.redisPrefix)

  const redis = createRedis(config.redisUrl, log, 'commands')
  await connectRedis(redis, config.redisUrl)
  const subscriber = createRedis(config.redisUrl, log, 'subscriber')
  await connectRedis(subscriber, config.redisUrl)
  const pubsub = createPubSub(subscriber)
  // A lock wait shorter than a statement: a table an operator locks (`alter table`, `vacuum full`, an
  // open `lock table`) holds each connection whose statement touches it this long, not the statement
  // timeout, so the pool is not all waiting on that table while routes on others queue behind it.
  const { statementTimeoutMs, lockTimeoutMs } = config
  const sql = createSql(config.databaseUrl, { max: config.databasePoolMax, statementTimeoutMs, lockTimeoutMs, settings: requestSettings })
  const workerSql = createSql(config.databaseUrl, { max: 10, statementTimeoutMs, lockTimeoutMs, settings: requestSettings })
  // The invoice run's statements run one after another. They wait for locks as long as they are held,
  // deliberately: on these connections of its own a wait holds no request's or worker's connection;
  // its last counting pass waits, by design, for the periods the metering workers hold; and a run
  // given up would leave the invoices late for as long as the lock is held all the same. (A purchase
  // waits for invoice_counter behind the run's batches within its statement timeout: issuePurchaseInvoice.)
  const invoiceSql = createSql(config.databaseUrl, { max: 2 })

  const database = await watchDatabaseIdentity(sql, log)
  database.onChange((identity, previous) =>
    log.warn('postgres is another database than before (a backup restored, a replica promoted): what was derived from it is dropped', {
      identity,
      previous,
    }),
  )
  const keyCache = await createKeyCache({ sql, redis, pubsub, channel: keys.channels.keyRevoked, clock, log, database })
  const rateLimiter = createRateLimiter(redis, keys, clock, config.rateLimits)
  const authenticator = createAuthenticator({
    sql,
    verifyJwt: createJwtVerifier(
      config.auth,
      log,
      config.auth.jwksUrl ? keptKeySet(redis, keys.jwks, config.auth.jwksUrl, staleKeysForMs) : undefined,
    ),
    keys: keyCache,
    database,
    clientIp: clientIpResolver(config.trustedProxies),
    unknownKeys: createUnknownKeyLimit(rateLimiter, config.rateLimits.apiKeyMisses, clock, log),
  })
  const inFlight = createInFlightLimiter(redis, keys, clock)
  const proxyBuffers = createBufferBudget(config.proxy.bufferBytes)
  // Agents' replies run in batches with Postgres connections of their own, so a batch never waits
  // behind requests' queries, nor they behind it; their Redis calls share writes on an auto-pipelined
  // connection of their own.
  const batchRedis = redis.duplicate({ enableAutoPipelining: true, connectionName: 'agent-marketplace:batches' })
  // The writer's statements touch a few conversations by key. While the table is small (a few thousand
  // rows) the planner, taking the JSON input for 100 rows, hash-joins it against a scan of the whole
  // table instead (replies to waiting conversations cost Postgres 8 to 10 times the CPU in the bench,
  // 2026-11-27); these connections run nothing else, so they keep to the keyed lookups it picks at scale.
  const replySql = createSql(config.databaseUrl, { max: 2 * replyBatches, statementTimeoutMs, lockTimeoutMs, settings: replySettings })
  const replies = createReplyWriter({ sql: replySql, redis: batchRedis, keys, pubsub, clock, log, batches: replyBatches })
  const dispatcher = await createDispatcher({ redis, pubsub, keys, log })
  const inboxes = await createInboxReader({ sql, redis, keys, pubsub, clock, database })
  const queues = createQueues(config, keys, log)
  const events = await createEventHub({ redis, pubsub, keys, log, isKeyLive: async hex => typeof (await keyCache.lookup(hex)) === 'object' })
  const blogQueue = createBlogQueue({ redis, keys, clock, log })
  const markdown = createMarkdownRenderer({ log, timeoutMs: options.renderTimeoutMs })
  const metrics = createMetrics({ process: metricsServed(config) })
  for (const connection of [redis, subscriber, batchRedis, queues.connection]) metrics.watchRedis(connection)
  const readSources = registerCollectors(metrics.registry, {
    sql,
    redis,
    keys,
    openStreams: () => events.size,
    queues: queues.all,
    connections: metrics.connections,
  })
  metrics.readBeforeScrape(readSources)

  return {
    config,
    sql,
    workerSql,
    invoiceSql,
    database,
    redis,
    pubsub,
    keys,
    clock,
    log,
    authenticator,
    rateLimiter,
    inFlight,
    proxyBuffers,
    dispatcher,
    inboxes,
    replies,
    queues,
    events,
    blogQueue,
    markdown,
    metrics,
    lifecycle: createLifecycle(),
    async close() {
      await events.close()
      await markdown.close()
      await blogQueue.close()
      await queues.close()
      await inboxes.close()
      await dispatcher.close()
      await replies.close()
      await closeRedis(batchRedis)
      await replySql.end({ timeout: 5 })
      await keyCache.close()
      database.close()
      await pubsub.close()
      await closeRedis(redis)
      await sql.end({ timeout: 5 })
      await workerSql.end({ timeout: 5 })
      await invoiceSql.end({ timeout: 5 })
    },
  }
}
