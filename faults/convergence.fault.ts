/**
 * Convergence under chaos: two API and two workers processes under a seeded random mix of users'
 * messages, agents' polls and replies (keys repeated), and service requests, while faults come one at
 * a time (a workers or API process killed, Redis restarted with or without its data or paused,
 * PostgreSQL restarted). Then everything is healed and drained, and every agent's inbox must be what
 * Postgres holds, every acknowledged write stored once, every event received once.
 *
 * CONVERGENCE_SEED picks the mix's choices and the faults' order and lengths (printed on failure;
 * the timing of real processes still varies from run to run); CONVERGENCE_MS how long the mix runs
 * (default 60 s).
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { checkConvergence } from './lib/convergence-checks.ts'
import { createPopulation, startMix, unexpectedAnswers, type Mix } from './lib/convergence-mix.ts'
import { seeded, type Random } from '../test/helpers/seeded.ts'
import { removeLogs, startDeployment, type Deployment } from './lib/deployment.ts'
import { openEventStream, type EventStream } from './lib/event-stream.ts'
import { createClient } from './lib/http-client.ts'
import { problemCounts } from './lib/log-lines.ts'
import { running } from './lib/service-process.ts'
import { startWorld, type World } from './lib/world.ts'

const seed = Number(process.env.CONVERGENCE_SEED || Math.floor(Math.random() * 2 ** 31))
const mixMs = Number(process.env.CONVERGENCE_MS || 60_000)

type Fault = 'kill-workers' | 'kill-api' | 'redis-kept' | 'redis-lost' | 'redis-paused' | 'postgres-restart'
const faults: Fault[] = ['kill-workers', 'kill-api', 'redis-kept', 'redis-lost', 'redis-paused', 'postgres-restart']

/** Causes one fault and brings back what it stopped; says what it did. */
async function inject(fault: Fault, world: World, deployment: Deployment, random: Random): Promise<string> {
  switch (fault) {
    case 'kill-workers': {
      const slot = random.pick(['workers', 'workers-2'])
      await deployment.killAndRestart(slot, 500 + random.int(1500))
      return `${slot} killed and started again`
    }
    case 'kill-api': {
      const slot = random.pick(['api-1', 'api-2'])
      await deployment.killAndRestart(slot, 500 + random.int(1500))
      return `${slot} killed and started again`
    }
    case 'redis-kept':
    case 'redis-lost':
      await world.redis.restart({ keepData: fault === 'redis-kept', downMs: 1000 + random.int(2000) })
      return fault === 'redis-kept' ? 'Redis restarted keeping its data' : 'Redis restarted losing its data'
    case 'redis-paused': {
      const ms = 2000 + random.int(3000)
      world.redis.pause()
      await Bun.sleep(ms)
      world.redis.resume()
      return `Redis paused ${ms} ms`
    }
    case 'postgres-restart':
      await world.postgres.restart()
      return 'PostgreSQL restarted (-m fast)'
  }
}

let world: World | undefined
let deployment: Deployment | undefined
const streams = new Map<string, EventStream>()
let failed = false

beforeAll(async () => {
  world = await startWorld()
})

afterAll(async () => {
  for (const stream of streams.values()) stream.close()
  await deployment?.close()
  if (deployment && failed) console.error(`convergence (seed ${seed}): the processes' output is kept in ${deployment.logDir}`)
  else if (deployment) removeLogs(deployment)
  await world?.close()
})

test(`every inbox converges to Postgres after chaos (seed ${seed})`, async () => {
  const random = seeded(seed)
  // Until the checks pass, the processes' output is kept (a throw on the way keeps it too).
  failed = true
  deployment = await startDeployment('convergence', world!, {
    proxyAllowedHosts: '127.0.0.1',
    workers: 2,
    env: {
      RATE_LIMITS: JSON.stringify({
        messagePost: { capacity: 10_000, perSeconds: 1 },
        replyPost: { capacity: 10_000, perSeconds: 1 },
        serviceRequestCreate: { capacity: 10_000, perSeconds: 1 },
      }),
    },
  })
  const client = createClient(deployment.apiUrls)
  const population = await createPopulation(
    client,
    deployment.jwtSecret,
    random,
    { agents: 6, users: 12, perUser: 3 },
    randomBytes(3).toString('hex'),
  )
  for (const [index, person] of [...population.agents.map(a => a.owner), ...population.users].entries()) {
    streams.set(person.id, openEventStream(`stream ${index}`, deployment.apiUrls, person.token, index % 2))
  }
  await Promise.all([...streams.values()].map(stream => stream.connected()))

  const mix: Mix = startMix(client, population, random, 6)
  const done: string[] = []
  const startedAt = Date.now()
  const order = [...faults].sort(() => random.next() - 0.5)
  await Bun.sleep(3000)
  for (let i = 0; Date.now() - startedAt < mixMs - 3000; i++) {
    done.push(`+${Date.now() - startedAt} ms ${await inject(order[i % order.length]!, world!, deployment, random)}`)
    await Bun.sleep(2000 + random.int(4000))
  }
  await mix.stop()

  const checked = await checkConvergence({ deployment, redisUrl: world!.redis.url, client, population, mix, streams })
  const failures: Record<string, string[]> = {
    answers: unexpectedAnswers(mix),
    ...checked.failures,
    processes: deployment.all.filter(p => !running(p) && !p.killedOnPurpose).map(p => `${p.name} exited ${p.proc.exitCode ?? p.proc.signalCode}`),
  }
  const acked = mix.writes.filter(w => w.acked).length
  const report = [
    `seed ${seed}: ${mix.writes.length} writes (${acked} acknowledged), ${mix.polls.length} polls; ${checked.extent}; faults:`,
    ...done.map(line => `  ${line}`),
    ...deployment.all.map(p => `  ${p.name}: ${JSON.stringify(problemCounts(p))}`),
  ]
  console.log(report.join('\n'))
  const found = Object.entries(failures).filter(([, lines]) => lines.length > 0)
  failed = found.length > 0
  expect(found.map(([name, lines]) => `${name} (seed ${seed}):\n  - ${lines.slice(0, 30).join('\n  - ')}`).join('\n')).toBe('')
}, 600_000)
