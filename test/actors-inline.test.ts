/** Commands of idle actors applied by their sender: order with the mailbox, exactly once, and every way back to the runtime. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { startActorRuntime, type ActorRuntime } from '../src/actors/runtime.ts'
import { createDispatcher, type Dispatcher } from '../src/actors/dispatcher.ts'
import type { Sql } from '../src/db.ts'
import { holdActor } from './helpers/hold.ts'
import type { ActorKinds } from '../src/actors/types.ts'
import { AppError } from '../src/errors.ts'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { until } from './helpers/until.ts'

let ctx: TestContext
let dispatcher: Dispatcher
const runtimes: ActorRuntime[] = []
const projected: string[] = []
/** Command ids whose effect fails once (a bug, not an outage). */
const failOnce = new Set<string>()
/** Actors whose next projection fails this many times. */
const projectionFailures = new Map<string, number>()
/** Payload n whose effect waits for the test. */
const gates = new Map<number, Promise<void>>()

const kinds: ActorKinds = {
  log: {
    append: {
      async apply(tx, payload: { n: number }, { id, commandId }) {
        await gates.get(payload.n)
        if (failOnce.delete(commandId)) throw new Error('a bug that goes away')
        await tx`insert into actor_log (actor, n) values (${id}, ${payload.n})`
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
  },
}

const appended = async (actor: string) =>
  (await ctx.deps.sql<{ n: number }[]>`select n from actor_log where actor = ${actor} order by seq`).map(row => row.n)

const mailed = async (actor: string) => (await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).mailbox)) > 0

/** A dispatcher that applies the test's kind itself, with this lease length (the test closes it). */
function ownDispatcher(leaseMs: number, sql: Sql = ctx.deps.sql) {
  const { redis, keys, clock, log, pubsub } = ctx.deps
  return createDispatcher({ redis, pubsub, keys, log, inline: { sql, clock, kinds, leaseMs } })
}

/** Holds back the effect of payload n until the function returned is called. */
function gate(n: number): () => void {
  let open!: () => void
  gates.set(n, new Promise<void>(resolve => (open = resolve)))
  return open
}

async function runtime(leaseMs = 600) {
  const { sql, redis, keys, clock, log } = ctx.deps
  const started = await startActorRuntime({ sql, redis, keys, clock, log, kinds, leaseMs })
  runtimes.push(started)
  return started
}

beforeAll(async () => {
  ctx = await createTestContext()
  await ctx.deps.sql`create table actor_log (seq bigserial primary key, actor text not null, n integer not null)`
  dispatcher = await ownDispatcher(2000)
})
afterAll(async () => {
  for (const r of runtimes) await r.stop().catch(() => {})
  await dispatcher.close()
  await ctx.close()
})

describe('commands applied by their sender', () => {
  test('an idle actor’s command is applied at once, with no runtime, and leaves no mail, lease or mark', async () => {
    const actor = randomUUID()
    expect(await dispatcher.ask(`log:${actor}`, 'append', { n: 1 })).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([1])
    expect(projected).toContain(`${actor}:1`)
    // The mailbox it went through is gone, the lease let go (the actor is idle again), the mark taken away.
    expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`log:${actor}`).mailbox)).toBe(0)
    expect(await ctx.deps.redis.exists(ctx.deps.keys.actor(`log:${actor}`).lease)).toBe(0)
    await until(async () => (await ctx.deps.redis.zscore(ctx.deps.keys.actorsDue, `log:${actor}`)) === null)
  })

  test('many actors’ commands share one transaction; each actor’s stay in the order they were sent', async () => {
    const actors = Array.from({ length: 20 }, () => randomUUID())
    const answers = await Promise.all(
      actors.flatMap(actor => Array.from({ length: 5 }, (_, n) => dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n }))),
    )
    expect(answers.map(a => a.count)).toEqual(actors.flatMap(() => [1, 2, 3, 4, 5]))
    for (const actor of actors) expect(await appended(actor)).toEqual([0, 1, 2, 3, 4])
    const fences = await ctx.deps.sql`select count(*)::int as n from actor_fences where actor = any(${actors.map(a => `log:${a}`)})`
    expect(fences[0]!.n).toBe(20)
  })

  test('a held actor’s command waits in its mailbox; whoever takes the actor next applies it first', async () => {
    const actor = randomUUID()
    let letGo = (await holdActor(ctx.deps, `log:${actor}`))!
    expect(letGo).not.toBeNull()
    const first = dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 1 })
    await until(() => mailed(actor))
    await Bun.sleep(50)
    expect(await appended(actor)).toEqual([])
    // Idle again with mail, no runtime: the next sender takes it, and its command does not overtake.
    await letGo()
    expect(await dispatcher.ask(`log:${actor}`, 'append', { n: 2 })).toEqual({ count: 2 })
    expect(await first).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([1, 2])
    // Or a runtime, at once: the holder that lets go with mail left marks the actor due.
    letGo = (await holdActor(ctx.deps, `log:${actor}`))!
    const third = dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 3 })
    await until(() => mailed(actor))
    const r = await runtime()
    await letGo()
    expect(await third).toEqual({ count: 3 })
    await until(async () => r.stats().batchedCommands === 1)
    expect(await appended(actor)).toEqual([1, 2, 3])
    await r.stop()
  })

  test('commands that wait behind a mailed one follow it to the mailbox in order', async () => {
    const actor = randomUUID()
    const letGo = (await holdActor(ctx.deps, `log:${actor}`))!
    const sent = Array.from({ length: 6 }, (_, n) => dispatcher.tell(`log:${actor}`, 'append', { n }))
    await Promise.all(sent)
    await letGo()
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 6)
    expect(await appended(actor)).toEqual([0, 1, 2, 3, 4, 5])
    await r.stop()
  })

  test('a command sent while the actor is in this process’s batch waits for it, then applies in order', async () => {
    const actor = randomUUID()
    const open = gate(1001)
    const first = dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 1001 })
    await Bun.sleep(50)
    const second = dispatcher.ask<{ count: number }>(`log:${actor}`, 'append', { n: 1002 })
    await Bun.sleep(50)
    open()
    expect(await first).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 2 })
    expect(await appended(actor)).toEqual([1001, 1002])
    expect(await mailed(actor)).toBe(false)
  })

  test('a command sent while a runtime holds the actor is applied as the runtime lets go, not when the sender’s mark comes due', async () => {
    const actor = randomUUID()
    // A runtime holds the actor, its command held up; a process that applies nothing itself sent it.
    const mailOnly = await createDispatcher({ ...ctx.deps, inline: undefined })
    const open = gate(6001)
    const first = mailOnly.ask(`log:${actor}`, 'append', { n: 6001 })
    // Its claim lasts longer than the sender's mark (5 s against 3 s), so only its letting go brings the command on.
    const r = await runtime(5000)
    await until(() => ctx.deps.redis.exists(ctx.deps.keys.actor(`log:${actor}`).lease).then(n => n === 1))
    // Sent here, to an actor held elsewhere: it waits in the mailbox, its mark for after this sender's hold (3 s).
    const second = dispatcher.ask(`log:${actor}`, 'append', { n: 6002 })
    await until(() => ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${actor}`).mailbox).then(n => n === 2))
    open()
    expect(await first).toEqual({ count: 1 })
    const opened = Date.now()
    expect(await second).toEqual({ count: 2 })
    // The runtime let go with mail left and made it due at once, whoever had marked it.
    expect(Date.now() - opened).toBeLessThan(2000)
    expect(await appended(actor)).toEqual([6001, 6002])
    await r.stop()
    await mailOnly.close()
  })

  test('an actor a previous holder left with unfinished mail goes to the runtimes: its failing command takes no other actor down', async () => {
    const [sick, first, later] = [randomUUID(), randomUUID(), randomUUID()]
    // One batch here: the poisoned command rolls it back, so both actors' commands wait for a runtime.
    const poisoned = dispatcher.ask(`log:${sick}`, 'poison', {}, { timeoutMs: 25_000 }).catch(e => e)
    const firstAnswer = dispatcher.ask<{ count: number }>(`log:${first}`, 'append', { n: 1 })
    await until(async () => (await mailed(sick)) && (await mailed(first)))
    // The next batch with the sick actor in it: that actor is left alone (its mail read, never
    // acknowledged), so the other actor's command is applied here, with no runtime.
    const sickAgain = dispatcher.ask<{ count: number }>(`log:${sick}`, 'append', { n: 2 }, { timeoutMs: 25_000 })
    expect(await dispatcher.ask(`log:${later}`, 'append', { n: 3 })).toEqual({ count: 1 })
    expect(await appended(sick)).toEqual([])
    // A runtime then works the sick actor one command at a time: the poison to the dead letters, the rest applied.
    const r = await runtime()
    expect(await firstAnswer).toEqual({ count: 1 })
    expect(((await poisoned) as AppError).code).toBe('unavailable')
    expect(await sickAgain).toEqual({ count: 1 })
    expect(await ctx.deps.redis.xlen(ctx.deps.keys.actor(`log:${sick}`).dead)).toBe(1)
    await r.stop()
  }, 30_000)

  test('a sender-chosen id is applied once; a repeat gets the first result and is not projected again', async () => {
    const actor = randomUUID()
    const commandId = `key-${randomUUID()}`
    const first = await dispatcher.ask(`log:${actor}`, 'append', { n: 7 }, { commandId, requestHash: Buffer.from('aa', 'hex') })
    await dispatcher.ask(`log:${actor}`, 'append', { n: 8 })
    const again = await dispatcher.ask(`log:${actor}`, 'append', { n: 7 }, { commandId, requestHash: Buffer.from('aa', 'hex') })
    expect(first).toEqual({ count: 1 })
    expect(again).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([7, 8])
    expect(projected.filter(p => p === `${actor}:7`).length).toBe(1)
    const reused = await dispatcher.ask(`log:${actor}`, 'append', { n: 9 }, { commandId, requestHash: Buffer.from('bb', 'hex') })
    expect(reused).toEqual({ refused: 'idempotency_key_reused' })
    // Each command applied is recorded once (any mailbox entry may be read again); the repeat and the refusal are not.
    const [recorded] = await ctx.deps.sql`select count(*)::int as n from actor_applied where actor = ${`log:${actor}`}`
    expect(recorded!.n).toBe(2)
  })

  test('a batch that fails is rolled back and its commands stay in the mailboxes; the runtime applies each once', async () => {
    const good = randomUUID()
    const bad = randomUUID()
    const commandId = `fails-once-${randomUUID()}`
    failOnce.add(commandId)
    const answers = Promise.all([dispatcher.ask(`log:${good}`, 'append', { n: 1 }), dispatcher.ask(`log:${bad}`, 'append', { n: 2 }, { commandId })])
    await until(async () => (await mailed(good)) && (await mailed(bad)))
    expect(await appended(good)).toEqual([])
    const r = await runtime()
    expect(await answers).toEqual([{ count: 1 }, { count: 1 }])
    expect(await appended(good)).toEqual([1])
    expect(await appended(bad)).toEqual([2])
    await r.stop()
  })

  test('an actor whose lease call fails is let go, its command left in the mailbox; the other actors of its batch still apply here', async () => {
    const [broken, fine] = [randomUUID(), randomUUID()]
    const brokenKeys = ctx.deps.keys.actor(`log:${broken}`)
    // Its fencing counter holds no number: drawing the token fails after the command was appended and the lease taken.
    await ctx.deps.redis.set(brokenKeys.fence, 'not a number')
    const [brokenSent, fineSent] = await Promise.allSettled([
      dispatcher.tell(`log:${broken}`, 'append', { n: 1 }),
      dispatcher.tell(`log:${fine}`, 'append', { n: 1 }),
    ])
    // The sender cannot tell whether it went in: 503, "it may have been".
    expect(((brokenSent as PromiseRejectedResult).reason as AppError).code).toBe('unavailable')
    expect(fineSent.status).toBe('fulfilled')
    expect(await appended(fine)).toEqual([1])
    expect(await mailed(fine)).toBe(false)
    expect(await appended(broken)).toEqual([])
    expect(await mailed(broken)).toBe(true)
    // Not left held: once the counter is readable, a runtime takes the actor at once and applies the mail.
    expect(await ctx.deps.redis.exists(brokenKeys.lease)).toBe(0)
    await ctx.deps.redis.del(brokenKeys.fence)
    const r = await runtime()
    await until(async () => (await appended(broken)).length > 0)
    expect(await appended(broken)).toEqual([1])
    await r.stop()
  })

  test('a fencing token Redis lost is lifted past what Postgres saw, and the command still applies once', async () => {
    const actor = randomUUID()
    await dispatcher.ask(`log:${actor}`, 'append', { n: 1 })
    await ctx.deps.sql`update actor_fences set token = token + 100 where actor = ${`log:${actor}`}`
    const answer = dispatcher.ask(`log:${actor}`, 'append', { n: 2 })
    await until(() => mailed(actor))
    const [fence] = await ctx.deps.sql<{ token: string }[]>`select token from actor_fences where actor = ${`log:${actor}`}`
    expect(Number(await ctx.deps.redis.get(ctx.deps.keys.actor(`log:${actor}`).fence))).toBeGreaterThanOrEqual(Number(fence!.token))
    const r = await runtime()
    expect(await answer).toEqual({ count: 2 })
    expect(await appended(actor)).toEqual([1, 2])
    await r.stop()
  })

  test('a projection that fails is retried under the lease before the answer and before anything newer', async () => {
    const actor = randomUUID()
    projectionFailures.set(actor, 2)
    const first = dispatcher.ask(`log:${actor}`, 'append', { n: 1 })
    const second = dispatcher.ask(`log:${actor}`, 'append', { n: 2 })
    expect(await first).toEqual({ count: 1 })
    expect(await second).toEqual({ count: 2 })
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:1`, `${actor}:2`])
  })

  test('a projection given up when the lease is lost is answered, and made by the next holder of the actor', async () => {
    const { redis, keys } = ctx.deps
    const losing = await ownDispatcher(600)
    const actor = randomUUID()
    projectionFailures.set(actor, 1_000)
    const answer = losing.ask(`log:${actor}`, 'append', { n: 4001 })
    // Another holder takes the actor while the projection keeps failing: the renewal finds it gone.
    await until(() => redis.exists(keys.actor(`log:${actor}`).lease).then(n => n === 1))
    await redis.set(keys.actor(`log:${actor}`).lease, 'someone else', 'PX', 1500)
    expect(await answer).toEqual({ count: 1 })
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([])
    // Still in the mailbox: once Redis takes projections again, the next holder projects it, once.
    expect(await mailed(actor)).toBe(true)
    projectionFailures.delete(actor)
    const r = await runtime()
    await until(async () => !(await mailed(actor)), 10_000)
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:4001`])
    expect(await appended(actor)).toEqual([4001])
    await r.stop()
    await losing.close()
  })

  test('a projection given up at shutdown is answered, and made by the next holder of the actor', async () => {
    const closing = await ownDispatcher(2000)
    const actor = randomUUID()
    projectionFailures.set(actor, 1_000)
    const answer = closing.ask(`log:${actor}`, 'append', { n: 5001 })
    await until(async () => (await appended(actor)).length === 1)
    await closing.close()
    expect(await answer).toEqual({ count: 1 })
    expect(await mailed(actor)).toBe(true)
    projectionFailures.delete(actor)
    const r = await runtime()
    await until(async () => !(await mailed(actor)), 10_000)
    expect(projected.filter(p => p.startsWith(`${actor}:`))).toEqual([`${actor}:5001`])
    await r.stop()
  })

  test('closing sends what waits to the mailboxes and applies nothing more here', async () => {
    const closing = await ownDispatcher(2000)
    const actor = randomUUID()
    const open = gate(2001)
    const first = closing.ask(`log:${actor}`, 'append', { n: 2001 })
    await Bun.sleep(50)
    const second = closing.tell(`log:${actor}`, 'append', { n: 2002 })
    const closed = closing.close()
    open()
    await closed
    await second
    expect(await first).toEqual({ count: 1 })
    expect(await appended(actor)).toEqual([2001])
    expect(await mailed(actor)).toBe(true)
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 2)
    expect(await appended(actor)).toEqual([2001, 2002])
    await r.stop()
  })

  test('a batch that outlasts the lease keeps it, renewed, until the actor is let go', async () => {
    const { redis, keys } = ctx.deps
    const slow = await ownDispatcher(600)
    const actor = randomUUID()
    const open = gate(3001)
    const answer = slow.ask(`log:${actor}`, 'append', { n: 3001 })
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
    await slow.close()
  })

  test('with the database away the caller gets 503 at once, and the command waits in the mailbox to be applied once', async () => {
    const { redis, keys } = ctx.deps
    const { createSql } = await import('../src/db.ts')
    const away = createSql('postgres://postgres@127.0.0.1:1/none', { max: 1 })
    const broken = await ownDispatcher(2000, away)
    const actor = randomUUID()
    const failed = await broken.ask(`log:${actor}`, 'append', { n: 1 }).catch(e => e)
    expect(failed).toBeInstanceOf(AppError)
    expect((failed as AppError).code).toBe('unavailable')
    expect(await mailed(actor)).toBe(true)
    expect(await redis.exists(keys.actor(`log:${actor}`).lease)).toBe(0)
    await broken.close()
    await away.end({ timeout: 1 })
    const r = await runtime()
    await until(async () => (await appended(actor)).length === 1)
    expect(await appended(actor)).toEqual([1])
    await r.stop()
  })
})
