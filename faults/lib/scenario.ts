/**
 * A fault scenario as bun tests: one test runs the deployment under load through the fault, and
 * one test per check reads what it left. Whatever happens, the scenario's processes and streams are
 * ended afterwards; its logs are kept (and their place printed) when a check failed.
 */
import { afterAll, describe, test } from 'bun:test'
import { checkAnswers } from './check-answers.ts'
import { checkEvents } from './check-events.ts'
import { checkProcesses } from './check-processes.ts'
import { checkRecovery } from './check-recovery.ts'
import { checkSchedulers, watchSchedulers } from './check-schedulers.ts'
import { checkWrites } from './check-writes.ts'
import { removeLogs, startDeployment, type Deployment } from './deployment.ts'
import { openEventStream, type EventStream } from './event-stream.ts'
import { createClient } from './http-client.ts'
import { startLoad, type Load } from './load-driver.ts'
import { createPairs } from './population.ts'
import { summary } from './report.ts'
import type { FaultTimes, ScenarioRun } from './scenario-run.ts'
import type { World } from './world.ts'

export interface Scenario {
  /** Short, for names of databases and log directories. */
  slug: string
  /** Causes the fault and brings back what it stopped. */
  fault(world: World, deployment: Deployment): Promise<FaultTimes>
  /** Figures of its own, printed after the summary (what the fault measured). */
  report?(run: ScenarioRun): string
}

const pairCount = 4
const warmupMs = 3000
/** Load after the restarted server accepts connections again. */
const afterMs = 5000
/** How long the scheduler watch looks after that moment (the check allows 5 s; this tells how late). */
const schedulerWatchMs = 15_000

/** What a run holds that must be ended, also when it fails half way. */
interface Held {
  deployment?: Deployment
  streams: EventStream[]
  load?: Load
}

async function runScenario(world: World, scenario: Scenario, held: Held): Promise<ScenarioRun> {
  // The upstream serves every scenario of the file: this one's calls are those after this point.
  const upstreamFrom = world.upstream.received.length
  const deployment = await startDeployment(scenario.slug, world, { proxyAllowedHosts: '127.0.0.1' })
  held.deployment = deployment
  const client = createClient(deployment.apiUrls)
  const pairs = await createPairs(client, deployment.jwtSecret, world.upstream.url, pairCount)
  const streams = new Map<string, EventStream>()
  pairs.forEach((pair, index) => {
    streams.set(pair.owner.id, openEventStream(`owner of pair ${index}`, deployment.apiUrls, pair.owner.token, index % 2))
    streams.set(pair.user.id, openEventStream(`subscriber of pair ${index}`, deployment.apiUrls, pair.user.token, (index + 1) % 2))
  })
  held.streams.push(...streams.values())
  await Promise.all([...streams.values()].map(stream => stream.connected()))

  const load = startLoad(client, pairs, deployment.jwtSecret)
  held.load = load
  await Bun.sleep(warmupMs)
  const fault = await scenario.fault(world, deployment)
  const watch = watchSchedulers(world.redis.url, deployment.redisPrefix, schedulerWatchMs)
  await Bun.sleep(Math.max(0, fault.upAt + afterMs - Date.now()))
  await load.stop()
  const schedulers = await watch
  return {
    name: scenario.slug,
    servers: world,
    deployment,
    client,
    pairs,
    load,
    streams,
    fault,
    upstreamBodies: () => world.upstream.received.slice(upstreamFrom).map(request => request.body),
    schedulersBackAt: schedulers.backAt,
    schedulersSeen: schedulers.seen,
  }
}

/** Declares the scenario's tests; `world` is the file's servers, started in its beforeAll. */
export function describeScenario(title: string, world: () => World, scenario: Scenario): void {
  describe(title, () => {
    let run: ScenarioRun | undefined
    let failed = false
    const held: Held = { streams: [] }

    afterAll(async () => {
      for (const stream of held.streams) stream.close()
      await held.load?.stop()
      if (!held.deployment) return
      await held.deployment.close()
      if (failed) console.error(`${title}: the processes' output is kept in ${held.deployment.logDir}`)
      else removeLogs(held.deployment)
    })

    test('runs under load through the fault', async () => {
      try {
        run = await runScenario(world(), scenario, held)
      } catch (error) {
        failed = true
        throw error
      }
      console.log(summary(run))
      if (scenario.report) console.log(scenario.report(run))
    }, 180_000)

    const check = (name: string, body: (run: ScenarioRun) => string[] | Promise<string[]>) =>
      test(
        name,
        async () => {
          if (!run) throw new Error('the scenario did not run (see its first test)')
          const failures = await body(run)
          if (failures.length > 0) {
            failed = true
            throw new Error(`${title}: ${name}:\n  - ${failures.join('\n  - ')}`)
          }
        },
        60_000,
      )

    check('every answer is a 2xx, a 503 or a 409 in progress, and every write got through', checkAnswers)
    check('every acknowledged write is in Postgres exactly once', checkWrites)
    check('every event of an acknowledged write reached its recipient’s resumed stream', checkEvents)
    check('the job schedulers are in Redis again within 5 s', checkSchedulers)
    check('writes succeed again within 2 s of the restarted server accepting connections', checkRecovery)
    // Last, so it also covers the time the other checks waited.
    check('no service process exited unexpectedly', checkProcesses)
  })
}
