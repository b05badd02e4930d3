/** The actor runtime on its own: order, exactly-once effects, takeover after a crash, the ask pattern. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { startActorRuntime, type ActorRuntime } from '../src/actors/runtime.ts'
import type { ActorKinds } from '../src/actors/types.ts'
import { createHolder, isHold, type Hold } from '../src/actors/hold.ts'
import { createDue } from '../src/actors/due.ts'
import { createDispatcher } from '../src/actors/dispatcher.ts'
import { readDeadLetters, sendAgain } from '../src/actors/dead-letters.ts'
import { createCareful, deadLettersKept } from '../src/actors/careful.ts'
import { AppError } from '../src/errors.ts'
import { enqueueEvents } from '../src/events/outbox.ts'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { until } from './helpers/until.ts'
import { holdActor } from './helpers/hold.ts'
import { createLog } from '../src/log.ts'
import { closeRedis, connectRedis, createRedis } from '../src/redis.ts'
import { createPubSub } from '../src/pubsub.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { redisUrl } from './helpers/context.ts'
import { startRedisServer } from './helpers/redis-server.ts'
import { createKeys } from '../src/keys.ts'

let ctx: TestContext
const runtimes: ActorRuntime[] = []
let failOnce = new Set<string>()
// command id -> failures left; the error looks like a lost database connection
const outages = new Map<string, number>()
const projected: string[] = []
const repaired: string[] = []
// How often the `added` type's handler ran, committed or not.
let addedRuns = 0
const stalls: { entered(): void; released: Promise<void> }[] = []
/** Actors whose next projections fail this many times (as with Redis away). */
const projectionFailures = new Map<string, number>()
/** Payload n whose effect waits for the test. */
const gates = new Map<number, Promise<void>>()
/** The next `badInput` commands wait for the test, one each, before they fail. */
const badInputs: { entered(): void; released: Promise<void> }[] = []

// A toy kind: each 'append' inserts a row; the result is the running count for that actor.
const kinds: ActorKinds = {
  log: {
    append: {
      async apply(tx, payload: { n: number }, { id, commandId }) {
        await gates.get(payload.n)
        if (failOnce.delete(commandId)) throw new Error('transient failure')
        const left = outages.get(commandId) ?? 0
        if (left > 0) {
          outages.set(commandId, left - 1)
          throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })
        }
        await tx`insert into actor_log (actor, n) values (${id}, ${payload.n})`
        // An event for the user named like the actor: delivered once per command applied, however often it is redelivered.
        await enqueueEvents(tx, new Date(), [{ userId: id, type: 'context.updated', payload: { n: payload.n } }])
        const [row] = await tx<{ count: number }[]>`select count(*)::int as count from actor_log where actor = ${id}`
        return { count: row!.count }
      },
      async project(_result, payload: { n: number }, { id }) {
        const left = projectionFailures.get(id) ?? 0
        if (left > 0) {
          projectionFailures.set(id, left - 1)
          throw new Error('Connection is closed.')
        }
        projected.push(`${id}:${payload.n}`)
      },
    },
    poison: {
      async apply() {
        throw new Error('a bug in the handler')
      },
    },
    // Applied, but its projection always fails (not an outage): the actor's Redis state is repaired instead.
    unprojectable: {
      async apply(tx, _payload, { id }) {
        await tx`insert into actor_log (actor, n) values (${id}, 7)`
        return { applied: true }
      },
      async project() {
        throw new Error('WRONGTYPE Operation against a key holding the wrong kind of value')
      },
      async repair({ id }) {
        repaired.push(id)
      },
    },
    // Its effect takes a time a minute after its own, as a user's message after a reply stamped by a clock ahead.
    late: {
      async apply(tx, _payload, { id, at, passed }) {
        await tx`insert into actor_log (actor, n) values (${id}, 60)`
        passed?.(new Date(at.getTime() + 60_000))
        return { late: true }
      },
    },
    // A type a newer release added: the runtimes of `olderRelease` have no handler for it.
    added: {
      async apply(tx, _payload, { id }) {
        addedRuns++
        await tx`insert into actor_log (actor, n) values (${id}, 42)`
        return { added: true }
      },
    },
    // Input Postgres cannot store (refused as invalid_input once worked alone), after waiting for the test if it asked.
    badInput: {
      async apply() {
        const gate = badInputs.shift()
        if (gate) {
          gate.entered()
          await gate.released
        }
        throw Object.assign(new Error('invalid input syntax for type uuid: "x"'), { code: '22P02' })
      },
    },
    // Fails once, after waiting for the test to let it (to fail a batch at a chosen moment).
    stall: {
      async apply(tx, _payload, { id }) {
        if (stalls.length > 0) {
          const stall = stalls.shift()!
          stall.entered()
          await stall.released
          throw new Error('failed while stopping')
        }
        await tx`insert into actor_log (actor, n) values (${id}, 100)`
        return { stalled: false }
      },
    },
  },
}

/** The kinds as the release before knew them: without the `added` type. */
const olderRelease: ActorKinds = { log: Object.fromEntries(Object.entries(kinds.log!).filter(([type]) => type !== 'added')) }

async function runtime(options: Partial<Parameters<typeof startActorRuntime>[0]> = {}) {
  const { sql, redis, keys, clock, log } = ctx.deps
  const started = await startActorRuntime({ sql, redis, keys, clock, log, kinds, leaseMs: 600, ...options })
  runtimes.push(started)
  return started
}

/** The events the relay delivered to the actor's namesake user, by n. */
const announced = async (actor: string) =>
  ((await ctx.deps.redis.xrange(ctx.deps.keys.events.user(actor), '-', '+')) as [string, string[]][]).map(
    ([, fields]) => (JSON.parse(fields[3]!) as { n: number }).n,
  )

const appended = async (actor: string) =>
  (await ctx.deps.sql<{ n: number }[]>`select n from actor_log where actor = ${actor} order by seq`).map(row => row.n)

const mailed = async (actor: string) => (await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).mailbox)) > 0

/** Holds back the effect of payload n until the function returned is called. */
function gate(n: number): () => void {
  let open!: () => void
  gates.set(n, new Promise<void>(resolve => (open = resolve)))
  return open
}

/** A mailbox entry as the dispatcher writes it, for a command no one waits on. */
const entry = (n: number) => [
  'type',
  'append',
  'payload',
  JSON.stringify({ n }),
  'command',
  randomUUID(),
  'repeatable',
  '',
  'hash',
  '',
  'reply',
  '',
  'ask',
  '',
]

beforeAll(async () => {
  ctx = await createTestContext()
  await ctx.deps.sql`create table actor_log (seq bigserial primary key, actor text not null, n integer not null)`
})
afterAll(async () => {
  for (const r of runtimes) await r.stop().catch(() => {})
  await ctx.close()
})

describe('actor runtime', () => {
  test('applies an actor’s commands one at a time, in order, and answers asks', async () => {
    const r = await runtime()
    const actor = randomUUID()
    await Promise.all(Array.from({ length: 50 }, (_, n) => ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })))
    const result = await ctx.deps.dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 50 })
    expect(result).toEqual({ count: 51 })
    const order = await appended(actor)
    expect(order.length).toBe(51)
    expect(new Set(order).size).toBe(51)
    await r.stop()
  })

  test('commands sent one after another are applied in exactly that order', async () => {
    const r = await runtime()
    const actor = randomUUID()
    for (let n = 0; n < 40; n++) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
    await until(async () => (await appended(actor)).length === 40)
    expect(await appended(actor)).toEqual(Array.from({ length: 40 }, (_, n) => n))
    await r.stop()
  })

  test('an outage longer than the retry budget loses nothing: the command waits and is applied once', async () => {
    const r = await runtime()
    const actor = randomUUID()
    outages.set('during-outage', 8)
    const answer = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'during-outage', timeoutMs: 25_000 })
    await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n: 2 })
    expect(await answer).toEqual({ count: 1 })
    await until(async () => (await appended(actor)).length === 2)
    expect(await appended(actor)).toEqual([1, 2])
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).dead)).toBe(0)
    await r.stop()
  }, 30_000)

  test('a command that always fails goes to the dead-letter stream and the actor goes on', async () => {
    const r = await runtime()
    const actor = randomUUID()
    const failed = await ctx.deps.dispatcher.ask(`log:${actor}`, 'poison', {}, { timeoutMs: 20_000 }).catch(e => e)
    expect((failed as AppError).code).toBe('unavailable')
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 5 })).toEqual({ count: 1 })
    const dead = await ctx.deps.redis.xrange(ctx.deps.keys.actor(`log:${actor}`).dead, '-', '+')
    expect(dead.length).toBe(1)
    expect(dead[0]![1]).toContain('poison')
    await r.stop()
  }, 30_000)

  test('a type an older release has no handler for is dead-lettered there; sent again where it has one, it is applied once', async () => {
    const older = await runtime({ kinds: olderRelease })
    const actor = randomUUID()
    const failed = await ctx.deps.dispatcher.ask(`log:${actor}`, 'added', {}, { timeoutMs: 20_000 }).catch(e => e)
    expect((failed as AppError).code).toBe('unavailable')
    const letters = (await readDeadLetters(ctx.deps.redis, ctx.deps.keys)).filter(letter => letter.actor === `log:${actor}`)
    expect(letters.map(({ type, error }) => ({ type, error }))).toEqual([{ type: 'added', error: 'no handler for log command added' }])
    await older.stop()

    // Sent to its mailbox and marked due, for a runtime that is not looking at the actor otherwise.
    const { redis, keys } = ctx.deps
    await redis.zrem(keys.actorsDue, `log:${actor}`)
    await sendAgain(redis, keys, letters[0]!)
    expect(await redis.xlen(keys.actor(`log:${actor}`).mailbox)).toBe(1)
    expect(await redis.zscore(keys.actorsDue, `log:${actor}`)).not.toBeNull()
    const newer = await runtime()
    await until(async () => (await appended(actor)).includes(42))
    // Its last letter sent again, the stream goes: it is not kept, empty, for good.
    expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`log:${actor}`).dead)).toBe(0)
    // Sent again (a run cut off between its send and its delete): the command is known, and not applied twice.
    await sendAgain(ctx.deps.redis, ctx.deps.keys, letters[0]!)
    await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n: 43 })
    await until(async () => (await appended(actor)).includes(43))
    expect(await appended(actor)).toEqual([42, 43])
    // Found as applied before it was run: not run again in a transaction that the applied id's
    // primary key then rolls back.
    expect(addedRuns).toBe(1)
    await newer.stop()
  }, 40_000)

  test('an actor’s dead-letter stream keeps its newest letters up to a cap, not every one for good', async () => {
    const { redis, keys } = ctx.deps
    const actor = `log:${randomUUID()}`
    const careful = createCareful(
      redis,
      keys,
      createLog('error', () => {}),
    )
    const over = 300
    for (let n = 0; n < deadLettersKept + over; n++) {
      const fields = { type: 'poison', n: String(n) }
      const mail = [{ entryId: `${n + 1}-0`, list: Object.entries(fields).flat(), fields }]
      const hold: Hold = { actor, kind: 'log', token: 1, mail, redelivered: false, lost: false }
      for (let attempt = 1; attempt <= 5; attempt++) await careful.refuse(hold, new Error('poison'), true)
    }
    const dead = keys.actor(actor).dead
    const length = await redis.xlen(dead)
    expect(length).toBeGreaterThanOrEqual(deadLettersKept)
    expect(length).toBeLessThan(deadLettersKept + over)
    const [newest] = await redis.xrevrange(dead, '+', '-', 'COUNT', 1)
    expect(newest?.[1]).toContain(String(deadLettersKept + over - 1))
    await redis.unlink(dead)
  })

  test('a claim applied in Redis whose reply was lost hides its actors for a moment, not for a lease', async () => {
    const { redis, keys } = ctx.deps
    let lost = 0
    // The runtime's connection, but the first claim's reply is lost (a timeout under a latency spike):
    // Redis ran the script, marking the actor claimed; the runtime saw an error.
    const lossy = new Proxy(redis, {
      get(target, name, receiver) {
        if (name !== 'evalsha') {
          const value = Reflect.get(target, name, receiver)
          return typeof value === 'function' ? value.bind(target) : value
        }
        return async (...args: unknown[]) => {
          const result = await (target.evalsha as (...a: unknown[]) => Promise<unknown>)(...args)
          if (args[2] === keys.actorsDue && args[3] === keys.actorsDueBy && Array.isArray(result) && result.length > 0 && lost === 0) {
            lost++
            throw new Error('Command timed out')
          }
          return result
        }
      },
    })
    const r = await runtime({ redis: lossy, leaseMs: 10_000 })
    try {
      const actor = randomUUID()
      expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { timeoutMs: 6000 })).toEqual({ count: 1 })
      expect(lost).toBe(1)
    } finally {
      await r.stop()
    }
  }, 20_000)

  test('a command whose projection keeps failing is answered once applied, and the actor’s Redis state repaired', async () => {
    const r = await runtime()
    const actor = randomUUID()
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'unprojectable', {}, { timeoutMs: 20_000 })).toEqual({ applied: true })
    expect(await appended(actor)).toEqual([7])
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).dead)).toBe(0)
    await until(async () => repaired.includes(actor))
    expect(repaired.filter(a => a === actor)).toEqual([actor])
    await r.stop()
  }, 30_000)

  test('stopping under a backlog hands the unfinished actors on: a new runtime applies everything', async () => {
    const r1 = await runtime({ batchActors: 1, batches: 1 })
    const actors = Array.from({ length: 10 }, () => randomUUID())
    for (const actor of actors) for (let n = 0; n < 5; n++) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
    await r1.stop()
    const r2 = await runtime()
    for (const actor of actors) {
      await until(async () => (await appended(actor)).length === 5)
      expect(await appended(actor)).toEqual([0, 1, 2, 3, 4])
    }
    await r2.stop()
  })

  test('a repeat of an old command id sent later is answered but not projected again over newer state', async () => {
    const r = await runtime()
    const actor = randomUUID()
    await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'first' })
    await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 2 })
    const before = projected.filter(p => p.startsWith(actor)).length
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'first' })).toEqual({ count: 1 })
    expect(projected.filter(p => p.startsWith(actor)).length).toBe(before)
    // Nor announced again.
    await until(async () => (await announced(actor)).length === 2)
    await Bun.sleep(300)
    expect(await announced(actor)).toEqual([1, 2])
    expect(await appended(actor)).toEqual([1, 2])
    await r.stop()
  })

  test('mail whose mark Redis lost waits for the actor’s next command; then both apply, in order', async () => {
    const { redis, keys } = ctx.deps
    const actor = randomUUID()
    const first = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { timeoutMs: 10_000 })
    await until(async () => (await redis.xlen(keys.actor(`log:${actor}`).mailbox)) === 1)
    await redis.del(keys.actorsDue, keys.actorsDueBy)
    const r = await runtime()
    await Bun.sleep(300)
    expect(await appended(actor)).toEqual([])
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 2 })).toEqual({ count: 2 })
    expect(await first).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([1, 2])
    await r.stop()
  })

  test('a command appended twice (a call sent again after its reply was lost) is applied once, and no one is told it failed', async () => {
    const { redis, keys } = ctx.deps
    const actor = `log:${randomUUID()}`
    const fields = entry(8)
    const due = createDue(redis, keys)
    const r = await runtime()
    for (let time = 0; time < 2; time++) {
      await redis.xadd(keys.actor(actor).mailbox, '*', ...fields)
      await due.mark(actor)
      await until(async () => (await redis.exists(keys.actor(actor).mailbox)) === 0)
    }
    expect(await appended(actor.slice(4))).toEqual([8])
    expect(await redis.xlen(keys.actor(actor).dead)).toBe(0)
    await r.stop()
  })

  test('an idle runtime is woken by mail left to it, not left to look at its next round', async () => {
    const r = await runtime({ idleSeconds: 30 })
    // Its loops have found nothing and wait; the next look of their own would be 30 s away.
    await Bun.sleep(200)
    const actor = randomUUID()
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { timeoutMs: 5000 })).toEqual({ count: 1 })
    await r.stop()
  })

  test('a command to an idle actor is worked in one round: once it is answered, its mark goes at once', async () => {
    const r = await runtime({ leaseMs: 10_000 })
    for (let i = 0; i < 10; i++) {
      const actor = `log:${randomUUID()}`
      expect(await ctx.deps.dispatcher.ask(actor, 'append', { n: 1 })).toEqual({ count: 1 })
      // Drained, the runtime takes its claim away. A second mark landing after that claim would bring
      // a second claim, which finds the actor still held and looks again half a lease (5 s) later.
      await until(async () => (await ctx.deps.redis.zscore(ctx.deps.keys.actorsDue, actor)) === null, 1000)
    }
    await r.stop()
  })

  test('mail read by a runtime that died holding its actor comes due once its claim runs out, and is applied once', async () => {
    const { redis, keys } = ctx.deps
    const actor = `log:${randomUUID()}`
    await redis.xadd(keys.actor(actor).mailbox, '*', ...entry(9))
    // A runtime's steps up to its turn: the actor claimed (due again after its hold), taken with its
    // mail read; then the process dies (no turn, no release, no renewal).
    const due = createDue(redis, keys)
    await due.mark(actor)
    expect(await due.claim(1000, 450, 'the dead runtime')).toContain(actor)
    const [taken] = await createHolder(redis, keys, `dead:${randomUUID()}`, 300).take([{ actor, mail: 32 }])
    expect((taken as Hold).mail.length).toBe(1)
    const r = await runtime()
    await until(async () => (await appended(actor.slice(4))).length === 1)
    expect(await appended(actor.slice(4))).toEqual([9])
    // Drained: the mark goes, and the mailbox with it.
    await until(async () => (await redis.zscore(keys.actorsDue, actor)) === null)
    expect(await redis.exists(keys.actor(actor).mailbox)).toBe(0)
    await r.stop()
  })

  test('an actor whose holder died is taken again as its lease runs out, not a round of looks later', async () => {
    // Any runtime still running would look again on its own shorter lease.
    for (const r of runtimes) await r.stop().catch(() => {})
    const actor = `log:${randomUUID()}`
    // What a process killed holding the actor leaves: a lease that nobody renews, running out in 1 s.
    const [taken] = await createHolder(ctx.deps.redis, ctx.deps.keys, `dead:${randomUUID()}`, 1000).take([{ actor, mail: 0 }])
    expect(isHold(taken!)).toBe(true)
    // A runtime with the production lease's proportions: it looks again at a held actor once that
    // lease has run out (here 1 s), where it used to wait half of its own lease (4 s) a look.
    const r = await runtime({ leaseMs: 8000 })
    const sent = Date.now()
    expect(await ctx.deps.dispatcher.ask(actor, 'append', { n: 1 }, { timeoutMs: 7000 })).toEqual({ count: 1 })
    expect(Date.now() - sent).toBeLessThan(2500)
    await r.stop()
  })

  test('a batch that fails for an outage is tried again within half a lease, though another loop put its actor off meanwhile', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const { redis, keys, dispatcher } = ctx.deps
    const r = await runtime({ leaseMs: 6000 })
    const actor = `log:${randomUUID()}`
    const first = randomUUID()
    // The first command's turn waits for the test, then fails as if Postgres were away (an outage).
    outages.set(first, 1)
    const open = gate(301)
    const answered = dispatcher.ask(actor, 'append', { n: 301 }, { commandId: first, timeoutMs: 10_000 })
    await until(async () => (await redis.exists(keys.actor(actor).lease)) === 1, 2000)
    const holding = await redis.hget(keys.actorsDueBy, actor)
    // A second command meanwhile: its mark wakes the runtime's other loop, which finds the actor held
    // (its lease renewed, some 6 s to run) and puts its look off.
    const second = dispatcher.ask(actor, 'append', { n: 302 }, { timeoutMs: 10_000 })
    await until(async () => ![holding, '', null].includes(await redis.hget(keys.actorsDueBy, actor)), 2000)
    const opened = Date.now()
    open()
    // The failed batch lets go with both commands left and backs off 200 ms, but the mark is the other
    // loop's now: the mail is worked again at its look, half a lease (3 s) away, not when the lease would run out.
    expect(await answered).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 2 })
    expect(Date.now() - opened).toBeLessThan(4500)
    await r.stop()
  }, 15_000)

  test('a repeated command id is applied once and answered with the first result', async () => {
    const r = await runtime()
    const actor = randomUUID()
    const first = await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'same' })
    await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 2 })
    const again = await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'same' })
    expect(again).toEqual(first)
    expect(await appended(actor)).toEqual([1, 2])
    await r.stop()
  })

  test('a runtime killed mid-stream loses no command and applies none twice: another takes the actor over', async () => {
    const actor = randomUUID()
    let applied = 0
    const victim = await runtime({
      // After the effect of the 4th command commits, die before acknowledging it.
      beforeAck: () => {
        applied++
        if (applied === 4) victim.abandon()
      },
    })
    for (let n = 0; n < 20; n++) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
    await until(async () => applied >= 4)
    const survivor = await runtime()
    await until(async () => (await appended(actor)).length === 20)
    // Every entry acknowledged (the survivor's last batch acknowledges after its commit, however
    // loaded the machine), and then nothing applied twice.
    await until(async () => (await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).mailbox)) === 0)
    expect(await appended(actor)).toEqual(Array.from({ length: 20 }, (_, n) => n))
    const [left] = await ctx.deps.sql`select count(*)::int as n from actor_applied where actor = ${`log:${actor}`}`
    expect(left!.n).toBe(20)
    await survivor.stop()
  })

  test('two runtimes share many actors; each actor keeps its order and every command lands once', async () => {
    const r1 = await runtime()
    const r2 = await runtime()
    const actors = Array.from({ length: 10 }, () => randomUUID())
    await Promise.all(
      actors.map(async actor => {
        for (let n = 0; n < 30; n++) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
      }),
    )
    for (const actor of actors) {
      await until(async () => (await appended(actor)).length >= 30)
      expect(await appended(actor)).toEqual(Array.from({ length: 30 }, (_, n) => n))
    }
    await Promise.all([r1.stop(), r2.stop()])
  })

  test('a command whose effect fails is retried and applied once', async () => {
    const r = await runtime()
    const actor = randomUUID()
    failOnce = new Set(['flaky'])
    const result = await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 7 }, { commandId: 'flaky' })
    expect(result).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([7])
    await r.stop()
  })

  test('mail waiting for many actors is applied in shared transactions, each actor in order, each command once', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actors = Array.from({ length: 20 }, () => randomUUID())
    for (let n = 0; n < 3; n++) for (const actor of actors) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
    const r = await runtime()
    for (const actor of actors) await until(async () => (await appended(actor)).length === 3)
    for (const actor of actors) expect(await appended(actor)).toEqual([0, 1, 2])
    const stats = r.stats()
    expect(stats.batchedCommands).toBe(60)
    expect(stats.batches).toBeLessThan(20)
    expect(stats.singleCommands).toBe(0)
    expect(stats.rolledBack).toBe(0)
    // Each actor's clock moves on by at least a millisecond a command, across the batch.
    const times = await ctx.deps.sql<{ actor: string; at: Date }[]>`
      select actor, applied_at as at from actor_applied where actor = any(${actors.map(a => `log:${a}`)}::text[]) order by actor, applied_at
    `
    for (let i = 1; i < times.length; i++) {
      if (times[i]!.actor === times[i - 1]!.actor) expect(times[i]!.at.getTime()).toBeGreaterThan(times[i - 1]!.at.getTime())
    }
    await r.stop()
  })

  test('a command whose effect took a later time puts the actor’s next commands after it, in its batch and the next', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actor = randomUUID()
    await ctx.deps.dispatcher.tell(`log:${actor}`, 'late', {})
    for (let n = 0; n < 2; n++) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n })
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 3)
    expect(r.stats().batches).toBe(1)
    await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n: 2 })
    await until(async () => (await appended(actor)).length === 4)
    const times = (
      await ctx.deps.sql<{ at: Date }[]>`select applied_at as at from actor_applied where actor = ${`log:${actor}`} order by applied_at`
    ).map(row => row.at.getTime())
    expect(times.length).toBe(4)
    expect(times[1]!).toBeGreaterThan(times[0]! + 60_000)
    expect(times[2]!).toBeGreaterThan(times[1]!)
    expect(times[3]!).toBeGreaterThan(times[2]!)
    await r.stop()
  })

  test('a failing command rolls its batch back; the other actors’ commands are applied one at a time, once', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actors = Array.from({ length: 8 }, () => randomUUID())
    const sick = randomUUID()
    for (const actor of actors) await ctx.deps.dispatcher.tell(`log:${actor}`, 'append', { n: 1 })
    await ctx.deps.dispatcher.tell(`log:${sick}`, 'poison', {})
    await ctx.deps.dispatcher.tell(`log:${sick}`, 'append', { n: 2 })
    const r = await runtime()
    for (const actor of actors) await until(async () => (await appended(actor)).length === 1)
    await until(async () => (await appended(sick)).length === 1, 25_000)
    for (const actor of actors) expect(await appended(actor)).toEqual([1])
    expect(await appended(sick)).toEqual([2])
    // One command at a time, each announced once (its event rolled back with the failed batch); the poisoned one never.
    for (const actor of [...actors, sick]) await until(async () => (await announced(actor)).length > 0)
    await Bun.sleep(300)
    for (const actor of actors) expect(await announced(actor)).toEqual([1])
    expect(await announced(sick)).toEqual([2])
    // Only the first batch: after it the failing actor goes one command at a time, not taking others down.
    expect(r.stats().rolledBack).toBe(1)
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${sick}`).dead)).toBe(1)
    await r.stop()
  }, 30_000)

  test('a batch failed by bad input as the other loop claims its actor: the good command before it is applied, not refused', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actor = randomUUID()
    const { keys, log } = ctx.deps
    // The runtime's commands pass a proxy, which holds them at the chosen moment.
    const proxy = await startHeldProxy(redisUrl)
    const redis = createRedis(proxy.url, log, 'commands', 'careful-race')
    await connectRedis(redis, proxy.url)
    let entered!: () => void
    const inside = new Promise<void>(resolve => (entered = resolve))
    let fail!: () => void
    badInputs.push({ entered: () => entered(), released: new Promise<void>(resolve => (fail = resolve)) })
    // A lease long enough that no renewal is sent meanwhile.
    const r = await runtime({ redis, leaseMs: 30_000 })
    try {
      const good = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 31 }, { timeoutMs: 20_000 })
      await ctx.deps.dispatcher.tell(`log:${actor}`, 'badInput', {})
      // One loop applies both in a batch; the bad one waits, the other loop goes back to waiting for the doorbell.
      await inside
      await until(async () => (await ctx.deps.redis.llen(keys.actorsWake)) === 0)
      await Bun.sleep(100)
      proxy.hold()
      // A command's mark: the idle loop wakes and claims the actor, its claim held here.
      await createDue(ctx.deps.redis, keys).mark(`log:${actor}`)
      await until(async () => proxy.heldChunks() === 1)
      // The batch fails; its loop lets the actor go, behind the claim.
      fail()
      await until(async () => proxy.heldChunks() === 2)
      proxy.release()
      expect(await good).toEqual({ count: 1 })
      await until(async () => !(await mailed(actor)))
      expect(await appended(actor)).toEqual([31])
    } finally {
      proxy.release()
      await r.stop()
      await closeRedis(redis)
      await proxy.close()
    }
  }, 30_000)

  test('stopping while a batch fails releases its leases and hands its actors on at once', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const healthy = randomUUID()
    const stalled = randomUUID()
    let entered!: () => void
    const inside = new Promise<void>(resolve => (entered = resolve))
    let release!: () => void
    stalls.push({ entered: () => entered(), released: new Promise<void>(resolve => (release = resolve)) })
    await ctx.deps.dispatcher.tell(`log:${healthy}`, 'append', { n: 1 })
    await ctx.deps.dispatcher.tell(`log:${stalled}`, 'stall', {})
    const r = await runtime({ leaseMs: 5000 })
    await inside
    const stopping = r.stop()
    release()
    await stopping
    for (const actor of [healthy, stalled]) {
      expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`log:${actor}`).lease)).toBe(0)
      // Due at once, not when the stopped runtime's claim would have run out.
      expect(Number(await ctx.deps.redis.zscore(ctx.deps.keys.actorsDue, `log:${actor}`))).toBeLessThanOrEqual(Date.now() + 100)
    }
    const next = await runtime({ leaseMs: 5000 })
    await until(async () => (await appended(healthy)).length === 1 && (await appended(stalled)).length === 1, 5000)
    expect(await appended(healthy)).toEqual([1])
    expect(await appended(stalled)).toEqual([100])
    await next.stop()
  })

  test('one command id twice in one batch is applied once; the repeat gets the first result', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actor = randomUUID()
    const first = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'twice' })
    const second = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 }, { commandId: 'twice' })
    await Bun.sleep(50)
    const r = await runtime()
    expect(await first).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([1])
    expect(r.stats().singleCommands).toBe(0)
    await r.stop()
  })

  test('a holder fenced out in Postgres applies nothing; it raises its fence and the next hold applies the command once', async () => {
    const r = await runtime()
    const actor = randomUUID()
    // A newer holder (token 1000) has written here; this runtime's next token from Redis is far lower.
    await ctx.deps.sql`insert into actor_fences (actor, token, last_at) values (${`log:${actor}`}, 1000, now())`
    expect(await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 4 }, { timeoutMs: 10_000 })).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([4])
    expect(Number(await ctx.deps.redis.get(ctx.deps.keys.actor(`log:${actor}`).fence))).toBeGreaterThan(1000)
    await r.stop()
  })

  test('an answer lost while the asker’s subscriber was away from Redis is asked for again once it listens: answered, applied once', async () => {
    // The asking process's subscriber reaches Redis through a proxy the test stops; it sends and the runtime works directly.
    const proxy = await startHeldProxy(redisUrl)
    const subscriber = createRedis(proxy.url, ctx.deps.log, 'subscriber', 'lost-answers')
    await connectRedis(subscriber, proxy.url)
    const pubsub = createPubSub(subscriber)
    const dispatcher = await createDispatcher({ redis: ctx.deps.redis, pubsub, keys: ctx.deps.keys })
    const r = await runtime()
    try {
      const actor = randomUUID()
      const open = gate(21)
      // A random command id, as a message without an Idempotency-Key has.
      const answer = dispatcher.ask(`log:${actor}`, 'append', { n: 21 }, { timeoutMs: 15_000 })
      await proxy.stop()
      await until(async () => !pubsub.listening())
      // Applied, and its answer published and its entry acknowledged, while no one listened.
      open()
      await until(async () => (await appended(actor)).length === 1 && !(await mailed(actor)))
      await proxy.restart()
      expect(await answer).toEqual({ count: 1 })
      expect(await appended(actor)).toEqual([21])
    } finally {
      await r.stop()
      await dispatcher.close()
      await pubsub.close()
      await proxy.close()
    }
  }, 30_000)

  test('an ask nobody answers in time is 503 unavailable, and the command is still applied once later', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const actor = randomUUID()
    const error = await ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 9 }, { timeoutMs: 200 }).catch(e => e)
    expect(error).toBeInstanceOf(AppError)
    expect((error as AppError).status).toBe(503)
    expect((error as AppError).code).toBe('unavailable')
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 1)
    expect(await appended(actor)).toEqual([9])
    await r.stop()
  })

  test('a command whose actor could not be marked due is marked once Redis takes the mark: its mail never waits unmarked', async () => {
    // A Redis of the test's own, whose user may append to a stream but not run the mark's script
    // until the test allows it: the entry lands, both marks fail, the sender hears 503.
    const server = await startRedisServer()
    const admin = createRedis(server.url, ctx.deps.log, 'commands', 'admin')
    await connectRedis(admin, server.url)
    await admin.acl('SETUSER', 'sender', 'on', '>secret', '~*', '&*', '+@all', '-@scripting')
    const url = server.url.replace('redis://', 'redis://sender:secret@')
    const redis = createRedis(url, ctx.deps.log, 'commands', 'sender')
    const subscriber = createRedis(url, ctx.deps.log, 'subscriber', 'sender-subscriber')
    await Promise.all([connectRedis(redis, url), connectRedis(subscriber, url)])
    const pubsub = createPubSub(subscriber)
    const keys = createKeys(`am_test_${randomUUID()}:`)
    const dispatcher = await createDispatcher({ redis, pubsub, keys })
    try {
      const actor = `log:${randomUUID()}`
      const error = await dispatcher.tell(actor, 'append', { n: 1 }).catch(e => e)
      expect((error as AppError).code).toBe('unavailable')
      expect(await admin.xlen(keys.actor(actor).mailbox)).toBe(1)
      expect(await admin.zscore(keys.actorsDue, actor)).toBeNull()
      // Redis takes scripts again: nobody sends the actor anything more, and its mail is marked.
      await admin.acl('SETUSER', 'sender', '+@scripting')
      await until(async () => (await admin.zscore(keys.actorsDue, actor)) !== null, 10_000)
    } finally {
      await dispatcher.close()
      await pubsub.close()
      await Promise.all([closeRedis(redis), closeRedis(subscriber), closeRedis(admin)])
      await server.close()
    }
  }, 30_000)
})

describe('holding an actor', () => {
  test('a projection that fails is retried under the lease before the answer and before anything newer', async () => {
    const r = await runtime()
    const actor = randomUUID()
    projectionFailures.set(actor, 2)
    const first = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 })
    const second = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 2 })
    expect(await first).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 2 })
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:1`, `${actor}:2`])
    await r.stop()
  })

  test('projections failing alike for many actors (Redis away) are logged once, not once an attempt', async () => {
    const lines: string[] = []
    const r = await runtime({ log: createLog('warn', line => lines.push(line)) })
    const actors = [randomUUID(), randomUUID(), randomUUID()]
    for (const actor of actors) projectionFailures.set(actor, 2)
    await Promise.all(actors.map(actor => ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 1 })))
    for (const actor of actors) expect(projected).toContain(`${actor}:1`)
    const failed = lines.map(line => JSON.parse(line)).filter(record => record.msg === 'actor projection failed')
    // Six failed attempts: without the throttle, six records (a Redis at its maxmemory wrote one per attempt of every actor).
    expect(failed).toEqual([expect.objectContaining({ level: 'warn', error: 'Connection is closed.', attempt: 1 })])
    await r.stop()
  })

  test('a projection given up when the lease is lost is answered, and made by the next holder of the actor', async () => {
    const { redis, keys } = ctx.deps
    const r = await runtime()
    const actor = randomUUID()
    projectionFailures.set(actor, 1_000)
    const answer = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 4001 })
    // Another holder takes the actor while the projection keeps failing: the renewal finds it gone.
    await until(async () => (await appended(actor)).length === 1)
    await redis.set(keys.actor(`log:${actor}`).lease, 'someone else', 'PX', 1500)
    expect(await answer).toEqual({ count: 1 })
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([])
    // Still in the mailbox: once Redis takes projections again, the next holder projects it, once.
    expect(await mailed(actor)).toBe(true)
    projectionFailures.delete(actor)
    await until(async () => !(await mailed(actor)), 10_000)
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:4001`])
    expect(await appended(actor)).toEqual([4001])
    await r.stop()
  })

  test('a projection given up at shutdown is answered, and made by the next holder of the actor', async () => {
    const r1 = await runtime({ leaseMs: 2000 })
    const actor = randomUUID()
    projectionFailures.set(actor, 1_000)
    const answer = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 5001 })
    await until(async () => (await appended(actor)).length === 1)
    await r1.stop()
    expect(await answer).toEqual({ count: 1 })
    expect(await mailed(actor)).toBe(true)
    projectionFailures.delete(actor)
    const r2 = await runtime()
    await until(async () => !(await mailed(actor)), 10_000)
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:5001`])
    await r2.stop()
  })

  test('a batch that outlasts the lease keeps it, renewed, until the actor is let go', async () => {
    const { redis, keys } = ctx.deps
    const r = await runtime({ leaseMs: 600 })
    const actor = randomUUID()
    const open = gate(3001)
    const answer = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 3001 })
    try {
      await until(() => redis.exists(keys.actor(`log:${actor}`).lease).then(n => n === 1))
      // Three lease lengths later, still held: no one else can take the actor meanwhile.
      await Bun.sleep(1800)
      expect(await holdActor(ctx.deps, `log:${actor}`)).toBeNull()
    } finally {
      open()
    }
    expect(await answer).toEqual({ count: 1 })
    await until(() => redis.exists(keys.actor(`log:${actor}`).lease).then(n => n === 0))
    await r.stop()
  })

  test('an actor whose take fails is let go, its command left in the mailbox; the other actors of its batch still apply', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const [broken, fine] = [randomUUID(), randomUUID()]
    const brokenKeys = ctx.deps.keys.actor(`log:${broken}`)
    // Its fencing counter holds no number: drawing the token fails after the lease was taken.
    await ctx.deps.redis.set(brokenKeys.fence, 'not a number')
    await ctx.deps.dispatcher.tell(`log:${broken}`, 'append', { n: 1 })
    await ctx.deps.dispatcher.tell(`log:${fine}`, 'append', { n: 1 })
    const r = await runtime()
    await until(async () => (await appended(fine)).length === 1)
    expect(await mailed(fine)).toBe(false)
    expect(await appended(broken)).toEqual([])
    expect(await mailed(broken)).toBe(true)
    // Not left held: once the counter is readable, the runtime takes the actor and applies the mail.
    expect(await ctx.deps.redis.exists(brokenKeys.lease)).toBe(0)
    await ctx.deps.redis.del(brokenKeys.fence)
    await until(async () => (await appended(broken)).length > 0)
    expect(await appended(broken)).toEqual([1])
    await r.stop()
  })

  test('a take that fails in one loop leaves alone the actor its other loop holds: nobody else takes it mid-turn', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const { redis, keys } = ctx.deps
    const actor = randomUUID()
    const fence = keys.actor(`log:${actor}`).fence
    // The runtime's Redis, but a take of this actor fails as a whole once armed (its reply timed out, say).
    let armed = false
    let failed = false
    const flaky = new Proxy(redis, {
      get(target, prop) {
        if (prop === 'evalsha') {
          return (...args: unknown[]) => {
            if (armed && args.includes(fence)) {
              armed = false
              failed = true
              return Promise.reject(new Error('Command timed out'))
            }
            return (target.evalsha as (...a: unknown[]) => Promise<unknown>)(...args)
          }
        }
        const value = Reflect.get(target, prop, target)
        return typeof value === 'function' ? value.bind(target) : value
      },
    })
    const open = gate(901)
    const r = await runtime({ redis: flaky, leaseMs: 3000, batches: 2 })
    const first = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 901 }, { timeoutMs: 20_000 })
    // One loop holds the actor, its turn held up in the effect of 901.
    await until(async () => (await redis.exists(keys.actor(`log:${actor}`).lease)) === 1)
    await Bun.sleep(100)
    armed = true
    // The next command marks the actor due; the other loop claims it, and its take fails.
    const second = ctx.deps.dispatcher.ask(`log:${actor}`, 'append', { n: 902 }, { timeoutMs: 20_000 })
    await until(async () => failed)
    await Bun.sleep(200)
    // Still held by the loop in its turn: nobody else may take it.
    const other = await holdActor(ctx.deps, `log:${actor}`, 1000)
    expect(other).toBeNull()
    open()
    expect(await first).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 2 })
    expect(projected.filter(p => p === `${actor}:901`)).toEqual([`${actor}:901`])
    await r.stop()
  }, 30_000)

  test('a command sent to a held actor waits in its mailbox, and is applied as soon as the holder lets go', async () => {
    const r = await runtime({ leaseMs: 5000 })
    const actor = randomUUID()
    const letGo = (await holdActor(ctx.deps, `log:${actor}`, 30_000))!
    expect(letGo).not.toBeNull()
    const answer = ctx.deps.dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 1 })
    await until(() => mailed(actor))
    await Bun.sleep(100)
    expect(await appended(actor)).toEqual([])
    // The runtime found the actor held and looks again in half a lease; the holder's letting go with
    // mail left makes it due at once.
    const released = Date.now()
    await letGo()
    expect(await answer).toEqual({ count: 1 })
    expect(Date.now() - released).toBeLessThan(2000)
    await r.stop()
  })

  test('asks that time out with no runtime to apply them are logged once a minute, saying where their commands wait', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const { redis, pubsub, keys } = ctx.deps
    const lines: string[] = []
    const dispatcher = await createDispatcher({ redis, pubsub, keys, log: createLog('warn', line => lines.push(line)) })
    try {
      const actor = randomUUID()
      for (const n of [1, 2, 3]) {
        const failed = await dispatcher.ask(`log:${actor}`, 'append', { n }, { timeoutMs: 50 }).catch(e => e)
        expect((failed as AppError).code).toBe('unavailable')
      }
      // Without it, the 503s of a workers process gone had no cause in the log.
      expect(lines.map(line => JSON.parse(line))).toEqual([
        expect.objectContaining({
          level: 'warn',
          msg: 'actor command not answered in time; it waits in its mailbox until a workers process applies it',
          type: 'append',
          timeoutMs: 50,
        }),
      ])
    } finally {
      await dispatcher.close()
    }
  })

  test('closing a dispatcher waits for the sends under way and answers what waits 503; the mail stays for a runtime', async () => {
    for (const r of runtimes) await r.stop().catch(() => {})
    const { redis, pubsub, keys } = ctx.deps
    const closing = await createDispatcher({ redis, pubsub, keys })
    const actor = randomUUID()
    const asked = closing.ask(`log:${actor}`, 'append', { n: 1 }).catch(e => e)
    const told = closing.tell(`log:${actor}`, 'append', { n: 2 })
    await closing.close()
    expect(typeof (await told)).toBe('string')
    expect(((await asked) as AppError).code).toBe('unavailable')
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).mailbox)).toBe(2)
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 2)
    expect(await appended(actor)).toEqual([1, 2])
    await r.stop()
  })
})
