/** The outbox and its relay: an event is delivered if and only if its change committed, in order per user, once. */
import { afterAll, beforeAll, describe, expect, setSystemTime, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { Queue, Worker } from 'bullmq'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { until } from './helpers/until.ts'
import { enqueueEvents } from '../src/events/outbox.ts'
import { relayPass, replayWindowMs, startRelay, type Relay } from '../src/events/relay.ts'
import { createRedis, deleteByPrefix } from '../src/redis.ts'
import { createSql } from '../src/db.ts'
import { createLog } from '../src/log.ts'
import { keepSchedules, scheduledJobOptions, upsertSchedules } from '../workers/schedules.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { holdOpen } from './helpers/held-transaction.ts'

let ctx: TestContext

beforeAll(async () => {
  // No relay of the context's own: each test runs the relays it means to.
  ctx = await createTestContext({ relay: false })
})

afterAll(async () => {
  await ctx.close()
})

/** The `n` of each event in the user's stream, in stream order. */
const delivered = async (userId: string) =>
  ((await ctx.deps.redis.xrange(ctx.deps.keys.events.user(userId), '-', '+')) as [string, string[]][]).map(
    ([, fields]) => (JSON.parse(fields[3]!) as { n: number }).n,
  )

const waiting = async () => (await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from outbox`)[0]!.n

/** Commits `count` events for `userId`, numbered from `from`, one transaction each. */
async function commit(userId: string, from: number, count: number) {
  for (let n = from; n < from + count; n++) {
    await ctx.deps.sql.begin(tx => enqueueEvents(tx, new Date(), [{ userId, type: 'context.updated', payload: { n } }]))
  }
}

describe('the outbox relay', () => {
  test('events committed while Redis refuses wait in Postgres and are delivered, in order, once it takes them', async () => {
    const user = randomUUID()
    // A Redis nobody listens on: every append fails, as in an outage.
    const away = createRedis('redis://127.0.0.1:1', ctx.deps.log, 'commands')
    const failing = startRelay({ ...ctx.deps, redis: away }, { everyMs: 10 })
    await commit(user, 1, 20)
    await Bun.sleep(200)
    expect(await delivered(user)).toEqual([])
    expect(await waiting()).toBe(20)
    await failing.stop()
    away.disconnect()

    const relay = startRelay(ctx.deps, { everyMs: 10 })
    await until(async () => (await delivered(user)).length === 20)
    await relay.stop()
    expect(await delivered(user)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
    expect(await waiting()).toBe(0)
  })

  test('a stream expires a replay window after its newest event, when it has nothing left to replay', async () => {
    const user = randomUUID()
    await commit(user, 1, 2)
    await ctx.deps.sql.begin(tx => enqueueEvents(tx, new Date(), [{ userId: null, type: 'chat.message', payload: { n: 1 } }]))
    await relayPass(ctx.deps, 500)
    expect(await delivered(user)).toEqual([1, 2])
    for (const stream of [ctx.deps.keys.events.user(user), ctx.deps.keys.events.chat]) {
      const ttl = await ctx.deps.redis.pttl(stream)
      expect(ttl).toBeGreaterThan(replayWindowMs - 60_000)
      expect(ttl).toBeLessThanOrEqual(replayWindowMs)
    }
  })

  test('30,000 events recorded at once (past a statement’s 65,535 parameters as a list of values) keep their order', async () => {
    const userId = randomUUID()
    const events = Array.from({ length: 30_000 }, (_, n) => ({ userId, type: 'context.updated' as const, payload: { n } }))
    await ctx.deps.sql.begin(tx => enqueueEvents(tx, new Date(), events))
    const rows = await ctx.deps.sql<{ data: string }[]>`select data from outbox where user_id = ${userId} order by id`
    expect(rows.map(row => (JSON.parse(row.data) as { n: number }).n)).toEqual(events.map(e => e.payload.n))
    await ctx.deps.sql`delete from outbox where user_id = ${userId}`
  })

  test('a backlog is read through the key, not scanned, by a connection that cached its plan while the outbox was empty', async () => {
    // One connection, so the passes and the explanation share its prepared statement. Its plan, made
    // while the outbox is empty (as it is most of the time), is what a burst of events then meets.
    const one = createSql(ctx.database.url, { max: 1 })
    try {
      await one`vacuum outbox`
      for (let pass = 0; pass < 6; pass++) await relayPass({ ...ctx.deps, sql: one }, 500)
      await one`
        insert into outbox (user_id, type, data)
        select gen_random_uuid(), 'context.updated', '{}' from generate_series(1, 5000)
      `
      const [prepared] = await one<{ name: string }[]>`
        select name from pg_prepared_statements
        where statement like '%from outbox order by id limit%' and statement not like '%pg_prepared_statements%'
      `
      const plan = (await one.unsafe(`explain execute "${prepared!.name}"(500)`)).map(row => row['QUERY PLAN']).join('\n')
      expect(plan).toContain('Index Scan using outbox_pkey')
      expect(plan).not.toContain('Seq Scan')
    } finally {
      await one`delete from outbox`
      await one.end()
    }
  })

  test('a change that rolls back sends nothing', async () => {
    const user = randomUUID()
    await ctx.deps.sql
      .begin(async tx => {
        await enqueueEvents(tx, new Date(), [{ userId: user, type: 'context.updated', payload: { n: 1 } }])
        throw new Error('the change failed')
      })
      .catch(() => {})
    await commit(user, 2, 1)
    const relay = startRelay(ctx.deps, { everyMs: 10 })
    await until(async () => (await delivered(user)).length > 0)
    await relay.stop()
    expect(await delivered(user)).toEqual([2])
  })

  test('an event Redis refuses waits for the next pass with its user’s later ones; the others are sent once', async () => {
    const user = randomUUID()
    const other = randomUUID()
    await commit(user, 1, 2)
    await commit(other, 1, 1)
    await commit(user, 3, 1)
    await commit(other, 2, 1)
    // The other user's stream key holds a string: their appends fail (WRONGTYPE); the user's go through.
    await ctx.deps.redis.set(ctx.deps.keys.events.user(other), 'not a stream')
    const pass = await relayPass(ctx.deps, 100)
    expect(pass?.sent).toBe(3)
    expect(String(pass?.error)).toContain('WRONGTYPE')
    expect(await delivered(user)).toEqual([1, 2, 3])
    expect(await waiting()).toBe(2)

    await ctx.deps.redis.del(ctx.deps.keys.events.user(other))
    expect(await relayPass(ctx.deps, 100)).toEqual({ sent: 2 })
    expect(await delivered(user)).toEqual([1, 2, 3])
    expect(await delivered(other)).toEqual([1, 2])
  })

  test('an event type’s effect runs on the pass’s events of that type; an event whose effect failed is not sent, nor its user’s later ones, until a pass does it', async () => {
    const [user, other] = [randomUUID(), randomUUID()]
    // More of the user's replies than a stream's newest entries a copy is checked against (`append`).
    const replies = Array.from({ length: 12 }, (_, i) => ({ userId: user, type: 'conversation.reply' as const, payload: { n: i + 1 } }))
    await ctx.deps.sql.begin(tx =>
      enqueueEvents(tx, new Date(), [
        ...replies,
        { userId: other, type: 'context.updated', payload: { n: 1 } },
        { userId: user, type: 'context.updated', payload: { n: 13 } },
      ]),
    )
    const seen: number[][] = []
    let fail = true
    const effects = {
      'conversation.reply': async (_tx: unknown, events: { userId: string | null; data: string }[]) => {
        seen.push(events.map(e => (JSON.parse(e.data) as { n: number }).n))
        if (fail) throw new Error('Redis refused the effect')
      },
    }
    const first = await relayPass({ ...ctx.deps, effects }, 100)
    expect(String(first?.error)).toContain('Redis refused the effect')
    // The other user's event went; the replies wait unsent, and so does the user's event after them.
    expect(first?.sent).toBe(1)
    expect(await waiting()).toBe(13)
    expect(await delivered(user)).toEqual([])
    fail = false
    expect(await relayPass({ ...ctx.deps, effects }, 100)).toEqual({ sent: 13 })
    const numbers = replies.map(r => r.payload.n)
    expect(seen).toEqual([numbers, numbers])
    expect(await waiting()).toBe(0)
    // Each once, in order.
    expect(await delivered(user)).toEqual([...numbers, 13])
    expect(await delivered(other)).toEqual([1])
  })

  test('appends that time out while Redis is paused, then run when it goes on, keep each event once', async () => {
    const server = await startRedisServer()
    const redis = createRedis(server.url, ctx.deps.log, 'commands')
    try {
      // As on a connection in use: connected, and the script loaded (else Redis refuses the late copies).
      await commit(randomUUID(), 1, 1)
      expect(await relayPass({ ...ctx.deps, redis }, 10)).toEqual({ sent: 1 })
      const user = randomUUID()
      await commit(user, 1, 3)
      server.pause()
      // Each pass's append times out after 3 s, waiting in Redis's socket to run once it goes on.
      const relay = startRelay({ ...ctx.deps, redis }, { everyMs: 10 })
      await Bun.sleep(7500)
      server.resume()
      await until(async () => (await waiting()) === 0, 15_000)
      await relay.stop()
      const kept = (await redis.xrange(ctx.deps.keys.events.user(user), '-', '+')) as [string, string[]][]
      expect(kept.map(([, fields]) => (JSON.parse(fields[3]!) as { n: number }).n)).toEqual([1, 2, 3])
    } finally {
      redis.disconnect()
      await server.close()
    }
  }, 40_000)

  /** The pid of the relay pass on the session named `applicationName` waiting to delete its rows, once it waits. */
  const deleting = async (applicationName: string) => {
    const waiter = () => ctx.deps.sql<{ pid: number }[]>`
      select pid from pg_stat_activity
      where datname = current_database() and application_name = ${applicationName}
        and wait_event_type = 'Lock' and query like 'delete from outbox%'
    `
    await until(async () => (await waiter()).length === 1)
    return (await waiter())[0]!.pid
  }

  /** A pass that appends the user's waiting events, then dies before its commit (its connection ended). */
  async function passThatDies(user: string) {
    // The pass has a session of its own, named so that only its backend is ended (the server is shared
    // with other tests' databases), without the lock_timeout that would end its wait before the test does.
    const applicationName = `outbox-pass-that-dies-${randomUUID()}`
    const own = createSql(ctx.database.url, { max: 1, applicationName })
    try {
      // Another session holds the rows: the pass appends them, then waits to delete them...
      const release = await holdOpen(ctx.deps.sql, tx => tx`select 1 from outbox where user_id = ${user} for update`)
      const dying = relayPass({ ...ctx.deps, sql: own }, 500).then(
        () => 'committed',
        () => 'died',
      )
      const pid = await deleting(applicationName)
      // ...and its process dies there: its transaction never commits.
      await ctx.deps.sql`select pg_terminate_backend(${pid})`
      expect(await dying).toBe('died')
      await release()
    } finally {
      // Its connection, ended inside the transaction, stays reserved to it: end() would wait for ever.
      await own.end({ timeout: 0 })
    }
  }

  test('a pass that dies between Redis and its commit: the next sends none of its events again, however many', async () => {
    const user = randomUUID()
    await commit(user, 1, 20)
    await passThatDies(user)
    expect(await delivered(user)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
    expect(await waiting()).toBe(20)
    expect(await relayPass(ctx.deps, 500)).toEqual({ sent: 20 })
    expect(await waiting()).toBe(0)
    expect(await delivered(user)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
  })

  test('nor an event it sent before an earlier row committed', async () => {
    const user = randomUUID()
    // 1 takes its row id first, but commits after 2 has been sent by the pass that dies.
    const commitFirst = await holdOpen(ctx.deps.sql, tx =>
      enqueueEvents(tx, new Date(), [{ userId: user, type: 'context.updated', payload: { n: 1 } }]),
    )
    await commit(user, 2, 1)
    await passThatDies(user)
    await commitFirst()
    expect(await relayPass(ctx.deps, 500)).toEqual({ sent: 2 })
    expect(await delivered(user)).toEqual([2, 1])
  })

  test('rows whose ids come again (a database restored) are sent as the new events they are', async () => {
    const user = randomUUID()
    await commit(user, 1, 3)
    const { first } = (await ctx.deps.sql<{ first: string }[]>`select min(id)::text as first from outbox where user_id = ${user}`)[0]!
    expect(await relayPass(ctx.deps, 500)).toEqual({ sent: 3 })
    const { next } = (await ctx.deps.sql<{ next: string }[]>`select nextval(pg_get_serial_sequence('outbox', 'id'))::text as next`)[0]!
    // The ids of the events just sent, taken again by other events.
    await ctx.deps.sql`select setval(pg_get_serial_sequence('outbox', 'id'), ${first}::bigint, false)`
    try {
      await commit(user, 4, 2)
      expect(await relayPass(ctx.deps, 500)).toEqual({ sent: 2 })
    } finally {
      await ctx.deps.sql`select setval(pg_get_serial_sequence('outbox', 'id'), ${next}::bigint)`
    }
    expect(await delivered(user)).toEqual([1, 2, 3, 4, 5])
  })

  test('relays running at once send every event once, each user’s in order', async () => {
    const users = Array.from({ length: 5 }, () => randomUUID())
    const relays: Relay[] = Array.from({ length: 4 }, () => startRelay(ctx.deps, { everyMs: 5, batch: 7 }))
    // Committed while the relays run, interleaved across users.
    const writers = users.map(user => commit(user, 1, 40))
    await Promise.all(writers)
    await until(async () => (await waiting()) === 0)
    await Promise.all(relays.map(relay => relay.stop()))
    for (const user of users) expect(await delivered(user)).toEqual(Array.from({ length: 40 }, (_, i) => i + 1))
  })
})

describe('job schedules', () => {
  test('are asserted again when Redis comes back without them, and by the timer meanwhile', async () => {
    const connection = createRedis(ctx.config.redisUrl, ctx.deps.log, 'bullmq')
    const queue = new Queue('schedules-test', { connection, prefix: ctx.deps.keys.bullPrefix })
    const exists = async () => (await queue.getJobScheduler('tick')) !== undefined
    const forget = () => deleteByPrefix(ctx.deps.redis, `${ctx.deps.keys.bullPrefix}:schedules-test:`)
    /** How many of the queue's keys were found and deleted. */
    const forgetCounted = async () => {
      let cursor = '0'
      let deleted = 0
      do {
        const [next, found] = await ctx.deps.redis.scan(cursor, 'MATCH', `${ctx.deps.keys.bullPrefix}:schedules-test:*`, 'COUNT', 1000)
        cursor = next
        if (found.length > 0) deleted += await ctx.deps.redis.unlink(...found)
      } while (cursor !== '0')
      return deleted
    }

    // On reconnect: the timer is an hour away, so only the connection's `ready` can bring it back.
    const onReady = await keepSchedules([{ queue, id: 'tick', job: 'tick', everyMs: 60_000 }], ctx.deps.redis, ctx.deps.log, 3_600_000)
    expect(await exists()).toBe(true)
    await forget()
    expect(await exists()).toBe(false)
    ctx.deps.redis.disconnect(true)
    await until(exists, 5000)
    onReady.stop()

    // On the timer: Redis emptied without the connection noticing. The timer, every 100 ms, may bring
    // the schedule back before a look could find it gone (on a busy host it did): what shows it was
    // gone is what the emptying deleted (the part above shows that deleting these keys loses it).
    const onTimer = await keepSchedules([{ queue, id: 'tick', job: 'tick', everyMs: 60_000 }], ctx.deps.redis, ctx.deps.log, 100)
    expect(await forgetCounted()).toBeGreaterThan(0)
    await until(exists, 5000)
    onTimer.stop()
    await queue.close()
    await connection.quit()
  })

  test('run on time again after the clock stepped back an hour', async () => {
    const connection = createRedis(ctx.config.redisUrl, ctx.deps.log, 'bullmq')
    const queue = new Queue('schedules-step', { connection, prefix: ctx.deps.keys.bullPrefix })
    let runs = 0
    const worker = new Worker('schedules-step', async () => void runs++, { connection, prefix: ctx.deps.keys.bullPrefix })
    const schedule = { queue, id: 'step', job: 'step', everyMs: 1000 }
    // Set while the clock ran an hour ahead, then stepped back (NTP correcting the host, a VM resumed
    // from a snapshot): its next run is an hour away by the clock now. (Bun's setSystemTime stops the
    // clock: only the schedule is made under it.)
    setSystemTime(new Date(Date.now() + 3_600_000))
    try {
      await upsertSchedules([schedule])
    } finally {
      setSystemTime()
    }
    const kept = await keepSchedules([schedule], ctx.deps.redis, ctx.deps.log, 100)
    try {
      await until(async () => runs >= 2, 10_000)
    } finally {
      kept.stop()
      await queue.removeJobScheduler('step')
      await worker.close()
      await queue.close()
      await connection.quit()
    }
  }, 30_000)

  test('stopped while Redis is down (a shutdown): the assertion in flight fails without a warning', async () => {
    // The workers' close stops the schedules and closes the connections under an assertion waiting
    // for Redis: it fails then, stopped on purpose, which is no failure to warn of.
    const server = await startRedisServer()
    const lines: { level: string; msg: string }[] = []
    const log = createLog('debug', line => lines.push(JSON.parse(line)))
    const connection = createRedis(server.url, log, 'bullmq')
    const queue = new Queue('schedules-stopped', { connection, prefix: ctx.deps.keys.bullPrefix })
    try {
      const kept = await keepSchedules([{ queue, id: 'tick', job: 'tick', everyMs: 60_000 }], connection, log, 100)
      let asked = 0
      const getJobScheduler = queue.getJobScheduler.bind(queue)
      queue.getJobScheduler = id => (asked++, getJobScheduler(id))
      await server.down({ keepData: false })
      // An assertion begun since Redis went down: it waits for Redis.
      const before = asked
      await until(async () => asked > before, 5000)
      const stoppedAt = lines.length
      kept.stop()
      connection.disconnect()
      await until(async () => lines.some(line => line.msg === 'job schedules not asserted: stopped'), 5000)
      const after = lines.slice(stoppedAt)
      expect(after.filter(line => /schedules/.test(line.msg)).map(line => line.level)).toEqual(['debug'])
    } finally {
      await queue.close()
      connection.disconnect()
      await server.close()
    }
  }, 30_000)

  test('keep their finished jobs for a while, not for ever', async () => {
    const connection = createRedis(ctx.config.redisUrl, ctx.deps.log, 'bullmq')
    const queue = new Queue('schedules-kept', { connection, prefix: ctx.deps.keys.bullPrefix })
    let done = 0
    const worker = new Worker('schedules-kept', async () => void done++, { connection, prefix: ctx.deps.keys.bullPrefix })
    const kept = await keepSchedules([{ queue, id: 'fast', job: 'fast', everyMs: 5 }], ctx.deps.redis, ctx.deps.log)
    try {
      await until(async () => done > 5, 20_000)
      // Kept for an operator to look at, each with its age limit (without one, BullMQ keeps them all).
      const finished = await queue.getJobs(['completed'])
      expect(finished.length).toBeGreaterThan(0)
      for (const job of finished) expect(job.opts).toMatchObject(scheduledJobOptions)
    } finally {
      kept.stop()
      await queue.removeJobScheduler('fast')
      await worker.close()
      await queue.close()
      await connection.quit()
    }
  }, 30_000)
})
