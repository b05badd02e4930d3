/**
 * What /metrics reads when scraped: open event streams, actor mailboxes, BullMQ queue depths and the
 * age of each queue's oldest due job, the outbox, Postgres and Redis (its memory against its
 * maxmemory). Mailboxes, queues and the outbox live in shared stores, so every process reports the
 * same values for them (aggregate with max, not sum): a process whose workers are gone is seen from
 * the API's scrape. A source that cannot be read within `readMs` leaves its metrics out of that
 * scrape (NaN where a metric has no labels) and says so in `metrics_collector_up`.
 */
import { Gauge, type Registry } from 'prom-client'
import type { Job, Queue } from 'bullmq'
import type { Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'

export interface CollectorSources {
  sql: Sql
  /** A connection that fails fast (commands): the mailboxes are read on it. */
  redis: Redis
  keys: Keys
  openStreams(): number
  /** Every BullMQ queue, for their counts. */
  queues: Queue[]
  /** The process's Redis connections whose state is reported, by their connection names. */
  connections: Set<Redis>
}

const readMs = 2000
const queueStates = ['wait', 'active', 'delayed', 'prioritized', 'waiting-children', 'failed'] as const

/**
 * Defines the scrape-time metrics; the returned function reads their sources (before each scrape:
 * Metrics.text()), and the metrics are then filled from what it read.
 */
export function registerCollectors(registry: Registry, sources: CollectorSources): () => Promise<void> {
  const registers = [registry]
  const mailboxes = reader(() => readMailboxes(sources.redis, sources.keys))
  const queues = reader(() => readQueues(sources.queues))
  const postgres = reader(() => readPostgres(sources.sql))
  // Apart from postgres: a large backlog that took long to count is not Postgres being down.
  const outbox = reader(() => readOutbox(sources.sql))
  const redisMemory = reader(() => readRedisMemory(sources.redis))
  const read = async () => {
    await Promise.all([mailboxes.read(), queues.read(), postgres.read(), outbox.read(), redisMemory.read()])
  }
  /** A gauge without labels, set at each scrape to `value`, read from the sources' last readings. */
  const gauge = (name: string, help: string, value: () => number) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        this.set(value())
      },
    })

  new Gauge({
    name: 'metrics_collector_up',
    help: 'Whether a scrape-time source could be read this scrape (1) or not (0: its metrics are NaN or left out)',
    labelNames: ['collector'] as const,
    registers,
    collect() {
      this.set({ collector: 'mailboxes' }, mailboxes.last ? 1 : 0)
      this.set({ collector: 'queues' }, queues.last ? 1 : 0)
      this.set({ collector: 'postgres' }, postgres.last ? 1 : 0)
      this.set({ collector: 'outbox' }, outbox.last === null ? 0 : 1)
      this.set({ collector: 'redis' }, redisMemory.last ? 1 : 0)
    },
  })
  gauge('sse_streams_open', 'Server-sent event streams open on this process', () => sources.openStreams())

  // A reading of the mailboxes, NaN when Redis could not be read.
  const fromMailboxes = (pick: (reading: MailboxReading) => number) => () => (mailboxes.last ? pick(mailboxes.last) : NaN)
  gauge(
    'actor_mailbox_commands',
    'Commands in actor mailboxes not yet applied and acknowledged, all actors (NaN: Redis could not be read)',
    fromMailboxes(r => r.commands),
  )
  gauge(
    'actor_mailboxes_with_mail',
    'Actors whose mailbox holds commands (NaN: Redis could not be read)',
    fromMailboxes(r => r.mailboxes),
  )
  gauge(
    'actor_mailbox_oldest_seconds',
    'Age of the oldest command not yet applied, in any mailbox (0: none) (NaN: Redis could not be read)',
    fromMailboxes(r => r.oldestSeconds),
  )

  new Gauge({
    name: 'queue_jobs',
    help: 'BullMQ jobs by queue and state (wait, active, delayed, prioritized, waiting-children, failed)',
    labelNames: ['queue', 'state'] as const,
    registers,
    collect() {
      this.reset()
      for (const { queue, counts } of queues.last ?? []) {
        for (const state of queueStates) this.set({ queue, state }, counts[state] ?? 0)
      }
    },
  })
  new Gauge({
    name: 'queue_oldest_job_seconds',
    help: 'How long the job first in line of each queue has been due and not taken: a waiting job since it was added (and its delay ran out), a delayed one since its time came (0: none)',
    labelNames: ['queue'] as const,
    registers,
    collect() {
      this.reset()
      for (const { queue, oldestSeconds } of queues.last ?? []) this.set({ queue }, oldestSeconds)
    },
  })
  gauge(
    'outbox_events',
    `Events committed and not yet relayed to Redis (counted up to ${outboxCountedUpTo}; NaN: not read)`,
    () => outbox.last ?? NaN,
  )

  gauge('postgres_up', 'Whether queries through the pool answered within 2 s', () => (postgres.last ? 1 : 0))
  gauge(
    'postgres_probe_seconds',
    'How long `select 1` took through the pool, waiting for a free connection included (NaN: no answer)',
    () => postgres.last?.probeSeconds ?? NaN,
  )
  new Gauge({
    name: 'postgres_connections',
    help: "The service's connections to its database by state (pg_stat_activity: every process of the service)",
    labelNames: ['state'] as const,
    registers,
    collect() {
      this.reset()
      for (const { state, count } of postgres.last?.connections ?? []) this.set({ state }, count)
    },
  })

  gauge(
    'postgres_lock_waits',
    "The service's connections waiting for a lock (pg_stat_activity: every process of the service; NaN: not read)",
    () => postgres.last?.lockWaits ?? NaN,
  )
  gauge(
    'postgres_server_connections',
    'Sessions on the database server, of every application and database (pg_stat_activity, background processes left out; NaN: not read)',
    () => postgres.last?.server.connections ?? NaN,
  )
  gauge('postgres_max_connections', "The database server's max_connections (NaN: not read)", () => postgres.last?.server.max ?? NaN)

  // A Redis at its maxmemory refuses every write (noeviction, which the service requires): each is 503.
  gauge(
    'redis_memory_used_bytes',
    "Memory Redis uses (INFO's used_memory; NaN: INFO could not be read or is refused)",
    () => redisMemory.last?.used ?? NaN,
  )
  gauge(
    'redis_memory_max_bytes',
    "Redis's maxmemory, past which it refuses writes (0: no limit; NaN: INFO could not be read or is refused)",
    () => redisMemory.last?.max ?? NaN,
  )
  new Gauge({
    name: 'redis_connection_ready',
    help: "Whether each of the process's Redis connections is ready (1) or down, connecting or closed (0); one never used yet is not shown",
    labelNames: ['connection'] as const,
    registers,
    collect() {
      this.reset()
      const ready = new Map<string, boolean>()
      for (const connection of sources.connections) {
        // A connection made on first use that has not been used (a worker's `batches`) is not down.
        if (connection.status === 'wait') continue
        const name = (connection.options.connectionName ?? 'unnamed').replace(/^agent-marketplace:/, '')
        ready.set(name, (ready.get(name) ?? true) && connection.status === 'ready')
      }
      for (const [connection, up] of ready) this.set({ connection }, up ? 1 : 0)
    },
  })

  return read
}

interface MailboxReading {
  commands: number
  mailboxes: number
  oldestSeconds: number
}

/**
 * The mailboxes of the actors marked due (every actor with mail is: src/actors/due.ts), found with
 * ZSCAN (which returns every actor marked throughout, however the scores move) and read a thousand a
 * round trip: each one's length, and its first entry, whose id is the time it was added (by Redis's
 * clock, which `now` comes from too). Finished entries are deleted, so what a mailbox holds is not
 * yet applied and acknowledged.
 */
async function readMailboxes(redis: Redis, keys: Keys): Promise<MailboxReading> {
  const [seconds, micros] = await redis.time()
  const now = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000)
  let commands = 0
  let mailboxes = 0
  let oldest = now
  const seen = new Set<string>()
  let cursor = '0'
  do {
    const [next, found] = await redis.zscan(keys.actorsDue, cursor, 'COUNT', 1000)
    cursor = next
    // ZSCAN answers member, score, member, score...; a member may come twice.
    const actors = found.filter((member, i) => i % 2 === 0 && !seen.has(member) && seen.add(member))
    if (actors.length === 0) continue
    const pipeline = redis.pipeline()
    for (const actor of actors) pipeline.xlen(keys.actor(actor).mailbox).xrange(keys.actor(actor).mailbox, '-', '+', 'COUNT', 1)
    const replies = (await pipeline.exec()) ?? []
    for (let i = 0; i < actors.length; i++) {
      const [lengthError, length] = replies[2 * i] ?? []
      const [, first] = replies[2 * i + 1] ?? []
      if (lengthError || typeof length !== 'number' || length === 0) continue
      commands += length
      mailboxes++
      const id = (first as [string, string[]][] | undefined)?.[0]?.[0]
      if (id) oldest = Math.min(oldest, Number(id.slice(0, id.indexOf('-'))))
    }
  } while (cursor !== '0')
  return { commands, mailboxes, oldestSeconds: Math.max(0, now - oldest) / 1000 }
}

/**
 * Each queue's counts, and how long its first job in line has been due: the oldest waiting job, and
 * the delayed job due first (which only a live worker moves to waiting: with none, it stays there
 * past its time). A job is due at its time of adding plus its delay (kept in its options: a delayed
 * job promoted to waiting has its `delay` field zeroed), by the adding process's clock.
 */
async function readQueues(queues: Queue[]) {
  const now = Date.now()
  const dueFor = (job: Job | undefined) => (job ? Math.max(0, now - job.timestamp - (job.opts.delay ?? 0)) / 1000 : 0)
  return Promise.all(
    queues.map(async queue => {
      const [counts, [waiting], [delayed]] = await Promise.all([queue.getJobCounts(...queueStates), queue.getWaiting(0, 0), queue.getDelayed(0, 0)])
      return { queue: queue.name, counts, oldestSeconds: Math.max(dueFor(waiting), dueFor(delayed)) }
    }),
  )
}

/** INFO's memory section; a Redis that refuses INFO (a managed one may) fails the read, and the metrics are NaN. */
async function readRedisMemory(redis: Redis): Promise<{ used: number; max: number }> {
  const info = await redis.info('memory')
  const field = (name: string) => Number(new RegExp(`^${name}:(\\d+)`, 'm').exec(info)?.[1] ?? NaN)
  return { used: field('used_memory'), max: field('maxmemory') }
}

/** Rows counted at most: a count through a backlog of millions would take seconds of every scrape. */
const outboxCountedUpTo = 1_000_000

async function readOutbox(sql: Sql): Promise<number> {
  const [row] = await sql<{ count: number }[]>`select count(*)::int as count from (select from outbox limit ${outboxCountedUpTo}) as waiting`
  return row!.count
}

async function readPostgres(sql: Sql) {
  const started = performance.now()
  await sql`select 1`
  const probeSeconds = (performance.now() - started) / 1000
  const connections = await sql<{ state: string; count: number; lockWaits: number }[]>`
    select coalesce(state, 'unknown') as state, count(*)::int as count, (count(*) filter (where wait_event_type = 'Lock'))::int as "lockWaits"
    from pg_stat_activity
    where datname = current_database() and application_name = current_setting('application_name')
    group by 1
  `
  // Every session on the server, whoever's: another application's may take the slots the service
  // needs. A role that is not a superuser sees other roles' sessions without their type, so they are
  // told from background processes by having a user and a database (the logical replication
  // launcher has a user but no database).
  const [server] = await sql<{ connections: number; max: number }[]>`
    select count(*)::int as connections, current_setting('max_connections')::int as max
    from pg_stat_activity
    where usesysid is not null and datid is not null
  `
  return { probeSeconds, connections: [...connections], lockWaits: connections.reduce((n, c) => n + c.lockWaits, 0), server: server! }
}

/**
 * A source read before each scrape: `last` is what the latest read found, null when it failed or took
 * over `readMs`. A read still under way (a source that hangs) is waited on again, never repeated.
 */
function reader<T>(readSource: () => Promise<T>) {
  let running: Promise<T> | undefined
  const state = {
    last: null as T | null,
    async read() {
      running ??= readSource().finally(() => (running = undefined))
      state.last = await within(running, readMs).catch(() => null)
    },
  }
  return state
}

function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('timeout')), ms)))
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}
