/** Redis connections: commands (fail fast), a subscriber, and BullMQ's (which must wait forever). */
import { Redis, type Cluster } from 'ioredis'
import calculateSlot from 'cluster-key-slot'
import { errorFields, throttled, type Log } from './log.ts'
import { firstLine, redactUrl } from './text.ts'
import { isCutOff, reconnectWhenReadOnly, refusalOnConnect, replaceWhenDead } from './redis-probe.ts'

export type { Redis }

/**
 * How long a command (not BullMQ's) waits for Redis's answer before it fails as an outage: a Redis
 * that stops answering (paused, swapping, a network that drops packets) keeps the connection open, so
 * without it a request would wait as long as the pause. A copy that blocks (BLPOP) adds its own wait.
 * A connection whose PING goes unanswered as long is replaced (redis-probe.ts).
 */
export const commandTimeoutMs = 3000

/**
 * Closes a connection: QUIT when it is ready (what it has sent is answered first), else ended at once.
 * With Redis away a QUIT would queue behind the commands waiting for it, which on a BullMQ connection
 * wait as long as Redis is gone (a process's drain then waited out SHUTDOWN_TIMEOUT_MS); ended, they
 * fail with "Connection is closed.". A QUIT unanswered within a second (Redis paused, or cut off by
 * the network, the connection still ready) ends it too: what it sent was sent, only answers are lost.
 */
export async function closeRedis(redis: Redis): Promise<void> {
  if (redis.status === 'ready' && (await settlesWithin(redis.quit(), quitWithinMs))) return
  redis.disconnect()
}

const quitWithinMs = 1000

/**
 * Whether a ready connection answers a PING within `ms`. One that does not (Redis paused, or cut off
 * by the network) holds what waits on it until the probe replaces it (redis-probe.ts).
 */
export async function answers(redis: Redis, ms = commandTimeoutMs): Promise<boolean> {
  return redis.status === 'ready' && (await settlesWithin(redis.ping(), ms))
}

/** Whether `promise` fulfils within `ms`. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<false>(resolve => (timer = setTimeout(resolve, ms, false)))
  try {
    return await Promise.race([
      promise.then(
        () => true,
        () => false,
      ),
      late,
    ])
  } finally {
    clearTimeout(timer)
  }
}

/** A connection; `name` (the role's by default) tells it apart in the log and in Redis's CLIENT LIST. */
export function createRedis(url: string, log: Log, role: 'commands' | 'subscriber' | 'bullmq', name: string = role): Redis {
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 3000,
    // API calls fail fast (503) when Redis is gone or stops answering; BullMQ requires null so its
    // blocking calls wait (and its producers' jobs wait for Redis rather than fail).
    maxRetriesPerRequest: role === 'bullmq' ? null : 2,
    ...(role === 'bullmq' ? {} : { commandTimeout: commandTimeoutMs }),
    // A command in flight when the connection drops fails (503) rather than going out again on the
    // next one: its caller may have taken its timeout as the outcome already, and a write sent twice
    // would count twice (a token taken, a lease entered). BullMQ's and the subscriber's go out again.
    autoResendUnfulfilledCommands: role !== 'commands',
    enableReadyCheck: true,
    // Reconnect at most 500 ms apart (ioredis's default grows to 2 s): a restarted Redis is back in use
    // within a second of accepting connections.
    retryStrategy: times => Math.min(times * 50, 500),
    connectionName: `agent-marketplace:${name}`,
  })
  return reported(redis, log)
}

/**
 * Gives a connection, and every copy made of it with `duplicate()` (ours, and those BullMQ makes for
 * its workers), a listener that logs its outages (without one, ioredis prints each failed
 * reconnection as text on stderr) and a probe that replaces it once it stops answering. Name a copy
 * with `connectionName` to tell it apart in the log.
 */
function reported(redis: Redis, log: Log): Redis {
  reportOutages(redis, log)
  replaceWhenDead(redis, log)
  redis.options.reconnectOnError = reconnectWhenReadOnly(redis, log)
  const duplicate = redis.duplicate.bind(redis)
  redis.duplicate = override => reported(duplicate(override), log)
  return redis
}

/** While an outage lasts, how often a connection says it is still down. */
const stillDownEveryMs = 60_000

/**
 * One record when the connection fails (with the first error; ioredis emits one per reconnection
 * attempt), one when it is ready again, and a reminder a minute while it stays down. A connection
 * Redis closes while it is up (`CLIENT KILL`, a `client-output-buffer-limit` it went past) raises no
 * error and reconnects at once: that is said once a minute, with how many were held back, so that a
 * subscriber killed at every burst of events shows in the log without flooding it.
 */
function reportOutages(redis: Redis, log: Log) {
  const connection = redis.options.connectionName
  let down: { since: number; said: number; failures: number } | null = null
  const closedByRedis = throttled(log, stillDownEveryMs)
  let closedByPeer = false
  redis.on('connect', () => {
    const stream = redis.stream
    // The peer's end of a stream this side had neither ended (as ioredis does for a reconnect it
    // chooses) nor destroyed (as the probe does; Bun then emits 'end' too). A QUIT's end reconnects nothing.
    stream.once('end', () => {
      if (!stream.writableEnded && !stream.destroyed) closedByPeer = true
    })
  })
  redis.on('error', (error: Error) => {
    // A reconnection that fails is an outage, reported as one.
    closedByPeer = false
    const now = performance.now()
    if (down === null) {
      const outage = (down = { since: now, said: now, failures: 1 })
      log.warn('redis connection lost', { connection, error: error.message })
      // Cut off as it reconnects, by a Redis that says why to a connection that listens.
      if (isCutOff(error)) {
        void refusalOnConnect(redis).then(refusal => {
          if (refusal !== null && down === outage) log.warn('redis refuses new connections', { connection, refusal })
        })
      }
      return
    }
    down.failures++
    if (now - down.said < stillDownEveryMs) return
    down.said = now
    log.warn('redis connection still down', { connection, error: error.message, downForMs: Math.round(now - down.since), failures: down.failures })
  })
  redis.on('ready', () => {
    if (closedByPeer && down === null) {
      closedByRedis('warn', 'closed', 'redis closed the connection; reconnected (CLIENT KILL, a client-output-buffer-limit, a restart?)', {
        connection,
      })
    }
    closedByPeer = false
    if (down === null) return
    log.info('redis connection back', { connection, downForMs: Math.round(performance.now() - down.since), failures: down.failures })
    down = null
  })
}

/**
 * Logs the errors of a BullMQ queue or worker. Those of its connections (it forwards them, once per
 * reconnection attempt) are already in the log as the connections' outages; the rest are written
 * once a minute per message, so a failure that repeats with every poll does not flood.
 */
export function reportQueueErrors(
  emitter: { on(event: 'error', listener: (error: Error) => void): unknown },
  log: Log,
  fields: Record<string, unknown>,
) {
  const write = throttled(log, stillDownEveryMs)
  emitter.on('error', error => {
    if (isConnectionFailure(error)) return
    write('warn', error.message, 'queue error', { ...fields, ...errorFields(error) })
  })
}

const connectionCodes = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN'])

/** A failure of the connection itself (logged as its outage), not a reply of Redis refusing the command (OOM, READONLY: no outage of the connection shows those). */
function isConnectionFailure(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code
  return (typeof code === 'string' && connectionCodes.has(code)) || (isRedisUnavailable(error) && !isRefusal(error))
}

/** A reply refusing the command for now (refusedForNow), or a MULTI aborted for such refusals. */
function isRefusal(error: unknown): boolean {
  const message = (error as Error | null)?.message ?? ''
  return refusedForNow.test(message) || /^EXECABORT /.test(message)
}

/**
 * Connects or throws a one-line error that says how to get Redis. A node of a Redis Cluster is
 * refused too: the connections are plain clients, which a node answers MOVED for every key on
 * another shard (the boot went on, `/health/ready` said 200, and most requests were 500).
 */
export async function connectRedis(redis: Redis, url: string): Promise<void> {
  // Why the connection failed (refused, a certificate not trusted, WRONGPASS) comes only as its error
  // event: connect() and the PING reject with "Connection is closed", whatever the cause.
  let cause: unknown
  const onError = (error: Error) => void (cause ??= error)
  redis.on('error', onError)
  try {
    if (redis.status === 'wait') await redis.connect()
    await redis.ping()
  } catch (error) {
    redis.disconnect()
    // A Redis at its `maxclients` accepts the connection, says so and closes it: say what it said.
    const refusal = isCutOff(cause) ? await refusalOnConnect(redis) : null
    if (refusal !== null) throw new Error(`Redis at REDIS_URL=${redactUrl(url)} refuses new connections: ${refusal}`)
    // Reached, and answering: starting a Redis, as the line below advises, is not the fix.
    if (/^(NOAUTH|WRONGPASS) /.test((cause as Error | undefined)?.message ?? '')) {
      throw new Error(
        `Redis at REDIS_URL=${redactUrl(url)} refuses its credentials (${firstLine(cause)}): put the user and password it expects in REDIS_URL (redis://user:password@host:port, percent-encoded; no user: the default one)`,
      )
    }
    // A plain Redis sent a TLS handshake waits for a command that never ends: a timeout, which the
    // advice to start one (it runs) or the bare ETIMEDOUT left to be guessed at.
    if (url.startsWith('rediss://') && /ETIMEDOUT/.test(firstLine(cause ?? error))) {
      throw new Error(
        `Redis is not reachable at REDIS_URL=${redactUrl(url)} (${firstLine(cause ?? error)}): rediss:// speaks TLS, which a Redis without TLS on that port never answers (use redis:// for it); else check that the host and port are reachable from here`,
      )
    }
    throw new Error(
      `Redis is not reachable at REDIS_URL=${redactUrl(url)} (${firstLine(cause ?? error)}): start one (Debian: apt-get install redis-server && redis-server --daemonize yes) or point REDIS_URL at yours`,
    )
  } finally {
    redis.off('error', onError)
  }
  // ioredis selects REDIS_URL's database as it connects, and a refusal (a number past the server's
  // `databases`) is only an error event: the connection went on in database 0, among others' keys.
  const db = redis.options.db ?? 0
  if (db !== 0) {
    await redis.select(db).catch((error: Error) => {
      redis.disconnect()
      throw new Error(`REDIS_URL=${redactUrl(url)} names database ${db}, which that Redis refuses: ${error.message}`)
    })
  }
  // A Redis that refuses INFO (a managed one may deny or rename it) is taken as it is.
  const info = await redis.info().catch(() => '')
  if (/^cluster_enabled:1\b/m.test(info)) {
    redis.disconnect()
    throw new Error(
      `REDIS_URL=${redactUrl(url)} is a node of a Redis Cluster (cluster_enabled:1), which the service does not support: point REDIS_URL at a standalone Redis (a primary, with replicas if you like)`,
    )
  }
  // An evicted mailbox, inbox, lease or job loses or hides writes without a word (BullMQ says so too,
  // once per queue, and goes on): a managed Redis's default (volatile-lru, say) stops the boot here.
  const policy = /^maxmemory_policy:(\S+)/m.exec(info)?.[1]
  if (policy !== undefined && policy !== 'noeviction') {
    redis.disconnect()
    throw new Error(
      `Redis at REDIS_URL=${redactUrl(url)} evicts keys (maxmemory-policy ${policy}), which would lose the service's writes: set maxmemory-policy noeviction`,
    )
  }
}

/**
 * Replies of a Redis that is up but refuses the command for now, whatever the command: out of memory
 * under `noeviction` (OOM), loading its data (LOADING), a script running too long (BUSY), writes
 * stopped after a failed snapshot (MISCONF), a replica after a failover (READONLY), a replica or
 * cluster without its primary (MASTERDOWN, CLUSTERDOWN, TRYAGAIN), the service's password taken away
 * under it (WRONGPASS, NOAUTH: a rotation done out of order), until an operator gives it back.
 */
const refusedForNow = /^(OOM|LOADING|BUSY|MISCONF|READONLY|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|WRONGPASS|NOAUTH) /

export function isRedisUnavailable(error: unknown): boolean {
  const e = error as { name?: string; message?: string; previousErrors?: unknown[] } | null
  return (
    e?.name === 'MaxRetriesPerRequestError' ||
    /Connection is closed|ECONNREFUSED|Stream isn't writeable|enableOfflineQueue|Command timed out/.test(e?.message ?? '') ||
    refusedForNow.test(e?.message ?? '') ||
    // A MULTI whose queued commands Redis refused (OOM, say) fails as EXECABORT, with their errors.
    (/^EXECABORT /.test(e?.message ?? '') && Array.isArray(e?.previousErrors) && e.previousErrors.some(isRedisUnavailable))
  )
}

/** Which Redis server a connection is on: a restarted or failed-over one may hold an older copy of the data. */
export interface ServerIdentity {
  /** The server's run id (`INFO server`), read once per connection; null where INFO is refused (a managed Redis may deny or rename it). */
  runId(): Promise<string | null>
  /** How many times the connection has closed: a reply that came across a close may be from another server than `runId` said. */
  closes(): number
}

/** The identity of a standalone server (on a Cluster each shard has its own run id, to be read by slot). */
export function watchServerIdentity(redis: Redis): ServerIdentity {
  let current: Promise<string | null> | undefined
  let closes = 0
  redis.on('close', () => {
    closes++
    current = undefined
  })
  const read = () =>
    redis.info('server').then(
      info => /^run_id:(\w+)/m.exec(info)?.[1] ?? null,
      (error: Error) => {
        // An error reply is the server refusing INFO; anything else (no connection, a timeout) is tried again.
        if (error.name === 'ReplyError') return null
        current = undefined
        throw error
      },
    )
  return { runId: () => (current ??= read()), closes: () => closes }
}

/** Deletes every key under a prefix (a test's or a benchmark's own), by SCAN, never a flush. */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0'
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
    cursor = next
    if (found.length > 0) await redis.unlink(...found)
  } while (cursor !== '0')
}

/** What a script runs on: a connection, or a Cluster client (which sends each call to its keys' node). */
export type ScriptClient = Redis | Cluster

export type Script = (redis: ScriptClient, keys: string[], args: (string | number)[]) => Promise<unknown>

/** A Lua script run by its SHA (EVALSHA), loaded on first use and again after a Redis restart. */
export function defineScript(lua: string): Script {
  const sha = new Bun.CryptoHasher('sha1').update(lua).digest('hex')
  return async (redis, keys, args) => {
    try {
      return await redis.evalsha(sha, keys.length, ...keys, ...args)
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error
      return redis.eval(lua, keys.length, ...keys, ...args)
    }
  }
}

/** One call of a batched script: its keys and arguments, and where its result goes. */
interface BatchedCall {
  keys: string[]
  args: (string | number)[]
  resolve(result: unknown): void
  reject(error: unknown): void
}

/**
 * A script many callers share: the calls made against one connection in one tick leave as one
 * EVALSHA instead of one each. `body` is the Lua of one call, run with `K` (its `keysPerCall` keys)
 * and `A` (its `argsPerCall` arguments) and returning its result (nil comes back as null). Each call
 * runs under `pcall`: one that raises an error fails alone, with what it did before the error left
 * in place, as a script of its own would have. A call's keys must share a hash tag; on a Redis
 * Cluster client only calls whose keys are in one slot go together. A proxy that shards one endpoint
 * by slot (not a Cluster client) is not supported. At most `maxCalls` calls go in one EVALSHA, so
 * that no script holds Redis for long.
 *
 * An EVALSHA that fails as a whole (Redis away, the connection lost) fails each of its calls, as it
 * would have failed each alone: callers already treat such an error as "may or may not have happened".
 * A call refused READONLY (a replica after a failover) fails the EVALSHA so, for the connection to
 * see the refusal and reconnect: caught in the call's place, it kept the connection on the replica.
 */
export function defineBatchedScript(body: string, keysPerCall: number, argsPerCall: number, maxCalls = 64): Script {
  const script = defineScript(`
local function call(K, A)
${body}
end
local out = {}
local calls = ${keysPerCall > 0 ? `#KEYS / ${keysPerCall}` : `#ARGV / ${argsPerCall}`}
for c = 0, calls - 1 do
  local K, A = {}, {}
  for i = 1, ${keysPerCall} do K[i] = KEYS[c * ${keysPerCall} + i] end
  for i = 1, ${argsPerCall} do A[i] = ARGV[c * ${argsPerCall} + i] end
  local ok, result = pcall(call, K, A)
  if not ok then
    if type(result) ~= 'table' or not result.err then result = { err = tostring(result) } end
    -- A replica (the old primary, after a failover) wrote none of the calls and would refuse each:
    -- the whole reply is its refusal, which the connection answers by reconnecting to the new primary
    -- (reconnectOnError never sees an error inside the reply).
    if string.sub(result.err, 1, 9) == 'READONLY ' then return result end
  elseif result == nil then
    result = false
  end
  out[c + 1] = result
end
return out`)
  const queues = new WeakMap<ScriptClient, BatchedCall[]>()

  const run = (redis: ScriptClient, calls: BatchedCall[]) => {
    script(
      redis,
      calls.flatMap(c => c.keys),
      calls.flatMap(c => c.args),
    ).then(
      results => {
        if (!Array.isArray(results) || results.length !== calls.length) {
          const error = new Error(
            `batched script returned ${Array.isArray(results) ? results.length : typeof results} results for ${calls.length} calls`,
          )
          for (const c of calls) c.reject(error)
          return
        }
        // A call's own error comes back in its place in the reply.
        calls.forEach((c, i) => (results[i] instanceof Error ? c.reject(results[i]) : c.resolve(results[i])))
      },
      error => {
        for (const c of calls) c.reject(error)
      },
    )
  }

  const flush = (redis: ScriptClient) => {
    const calls = queues.get(redis)!
    queues.delete(redis)
    const groups = redis.isCluster ? Map.groupBy(calls, c => calculateSlot(c.keys[0]!)).values() : [calls]
    for (const group of groups) {
      for (let i = 0; i < group.length; i += maxCalls) run(redis, group.slice(i, i + maxCalls))
    }
  }

  return (redis, keys, args) => {
    if (keys.length !== keysPerCall || args.length !== argsPerCall) {
      return Promise.reject(new Error(`batched script takes ${keysPerCall} keys and ${argsPerCall} arguments a call`))
    }
    return new Promise((resolve, reject) => {
      let queue = queues.get(redis)
      if (!queue) {
        queue = []
        queues.set(redis, queue)
        process.nextTick(flush, redis)
      }
      queue.push({ keys, args, resolve, reject })
    })
  }
}
