/**
 * PostgreSQL and Redis far away, under load: every byte between the service and its servers passes a
 * proxy that delays it (test/helpers/held-proxy.ts), 20 and 80 ms each way (a region
 * away, a continent away), then 20 ms with up to 40 ms of jitter, then spikes of 1 to 4 s on one busy
 * connection at a time (a path that loses every packet for a while). Every check holds as on near
 * servers, and the report gives each kind of request's latency at each distance (docs/operations.md,
 * "Far from PostgreSQL and Redis").
 */
import { afterAll, beforeAll } from 'bun:test'
import { startHeldProxy, type Delay, type HeldProxy, type Traffic } from '../test/helpers/held-proxy.ts'
import type { Deployment } from './lib/deployment.ts'
import { userToken } from './lib/population.ts'
import { describeScenario } from './lib/scenario.ts'
import type { ScenarioRun } from './lib/scenario-run.ts'
import { startWorld, type World } from './lib/world.ts'

interface Phase {
  label: string
  delay: Delay
  /** Spikes of 1 to 4 s on one connection at a time, one every 1.5 s, alternating PostgreSQL and Redis. */
  spikes?: boolean
  from?: number
  to?: number
  /** Opening a notification stream (a stream token, then the stream to its first line), in ms. */
  streamOpens: number[]
  traffic?: { postgres: Traffic; redis: Traffic }
}

const phaseMs = 8000
/** One-way delays to measure at, in ms: `LATENCY_MS=2,20,80,150` measures others. */
const distances = (process.env.LATENCY_MS ?? '20,80').split(',').map(Number)
const phases: Phase[] = [
  { label: 'near', delay: { toServer: 0, toClient: 0 }, streamOpens: [] },
  ...distances.map(ms => ({ label: `${ms} ms each way`, delay: { toServer: ms, toClient: ms }, streamOpens: [] })),
  { label: '20 ms + up to 40 ms jitter', delay: { toServer: 20, toClient: 20, jitterMs: 40 }, streamOpens: [] },
  { label: '2 ms, spikes of 1-4 s', delay: { toServer: 2, toClient: 2 }, spikes: true, streamOpens: [] },
]

let world: World | undefined
let proxies: { postgres: HeldProxy; redis: HeldProxy } | undefined
beforeAll(async () => {
  world = await startWorld()
  proxies = { postgres: await startHeldProxy(world.postgres.url()), redis: await startHeldProxy(world.redis.url) }
})
afterAll(async () => {
  await proxies?.postgres.close()
  await proxies?.redis.close()
  await world?.close()
})

/** The world as the service sees it: PostgreSQL and Redis behind the proxies. */
function routed(): World {
  if (!world || !proxies) throw new Error('the servers did not start (see the error of beforeAll)')
  const postgresPort = new URL(proxies.postgres.url).port
  return {
    ...world,
    postgres: {
      ...world.postgres,
      url: database => {
        const url = new URL(world!.postgres.url(database))
        url.port = postgresPort
        return url.toString()
      },
    },
    redis: { ...world.redis, url: proxies.redis.url },
  }
}

/** Opens a notification stream as a browser does: a one-use token, then the stream; ms to its first line. */
async function openStream(base: string, token: string): Promise<number> {
  const started = performance.now()
  const issued = await fetch(`${base}/v1/auth/sse-token`, { method: 'POST', headers: { authorization: `Bearer ${token}` } })
  if (issued.status !== 200) throw new Error(`sse-token: ${issued.status} ${await issued.text()}`)
  const { data } = (await issued.json()) as { data: { token: string } }
  const abort = new AbortController()
  const stream = await fetch(`${base}/v1/events/stream?token=${data.token}`, { signal: abort.signal })
  if (stream.status !== 200) throw new Error(`stream: ${stream.status} ${await stream.text()}`)
  await stream.body!.getReader().read()
  const ms = performance.now() - started
  abort.abort()
  return ms
}

/** Runs the phase: its delay for `phaseMs`, streams opened one after another meanwhile, spikes if asked. */
async function runPhase(phase: Phase, deployment: Deployment, token: string) {
  const { postgres, redis } = proxies!
  postgres.delay(phase.delay)
  redis.delay(phase.delay)
  postgres.resetTraffic()
  redis.resetTraffic()
  phase.from = Date.now()
  const end = phase.from + phaseMs
  const spiking = (async () => {
    for (let n = 0; phase.spikes && Date.now() < end - 1500; n++) {
      const proxy = n % 2 === 0 ? postgres : redis
      proxy.spike(1000 + Math.random() * 3000)
      await Bun.sleep(1500)
    }
  })()
  while (Date.now() < end) {
    phase.streamOpens.push(await openStream(deployment.apiUrls[phase.streamOpens.length % 2]!, token).catch(() => NaN))
    await Bun.sleep(500)
  }
  await spiking
  phase.to = Date.now()
  phase.traffic = { postgres: postgres.traffic(), redis: redis.traffic() }
}

const quantile = (sorted: number[], q: number) => (sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!)
const figures = (values: number[]) => {
  const sorted = values.filter(Number.isFinite).sort((a, b) => a - b)
  return `${String(Math.round(quantile(sorted, 0.5))).padStart(5)} ${String(Math.round(quantile(sorted, 0.95))).padStart(5)} ${String(Math.round(sorted.at(-1) ?? NaN)).padStart(5)}`
}

function report(run: ScenarioRun): string {
  const kinds = ['poll', 'reply', 'message', 'proxy', 'subscription', 'sign-in'] as const
  const lines = ['   latency by phase, ms (p50 p95 max) and answers other than 2xx:']
  for (const phase of phases) {
    lines.push(`   ${phase.label}:`)
    const inPhase = run.client.attempts.filter(attempt => attempt.startedAt >= phase.from! && attempt.startedAt < phase.to!)
    for (const kind of kinds) {
      const attempts = inPhase.filter(attempt => attempt.kind === kind)
      const other: Record<string, number> = {}
      for (const attempt of attempts) {
        if (attempt.status !== undefined && attempt.status < 300) continue
        const answer = attempt.status === undefined ? (attempt.error ?? 'no answer') : `${attempt.status} ${attempt.body?.error ?? ''}`.trim()
        other[answer] = (other[answer] ?? 0) + 1
      }
      const ok = attempts.filter(attempt => attempt.status !== undefined && attempt.status < 300).map(a => a.endedAt - a.startedAt)
      lines.push(
        `     ${kind.padEnd(13)} ${String(attempts.length).padStart(4)}  ${figures(ok)}  ${Object.keys(other).length ? JSON.stringify(other) : ''}`,
      )
    }
    lines.push(`     ${'stream open'.padEnd(13)} ${String(phase.streamOpens.length).padStart(4)}  ${figures(phase.streamOpens)}`)
    // conversation.message at the owner's stream, from the message's acknowledgement.
    const lags: number[] = []
    for (const write of run.load.writes) {
      if (write.kind !== 'message' || !write.acked || write.acked.endedAt < phase.from! || write.acked.endedAt >= phase.to!) continue
      const owner = run.streams.get(run.pairs[write.pair]!.owner.id)!
      const event = owner.events.find(e => e.type === 'conversation.message' && e.data?.messageId === write.ackedId)
      if (event) lags.push(event.receivedAt - write.acked.endedAt)
    }
    lines.push(`     ${'event lag'.padEnd(13)} ${String(lags.length).padStart(4)}  ${figures(lags)}`)
    const seconds = (phase.to! - phase.from!) / 1000
    const { postgres, redis } = phase.traffic!
    lines.push(
      `     exchanges a second: PostgreSQL ${Math.round(postgres.toServer / seconds)}, Redis ${Math.round(redis.toServer / seconds)}; ` +
        `connections opened: ${postgres.connections}, ${redis.connections}`,
    )
  }
  return lines.join('\n')
}

describeScenario('PostgreSQL and Redis far away', routed, {
  slug: 'latency',
  async fault(_world, deployment) {
    const token = await userToken(deployment.jwtSecret, `streams-${Date.now()}`)
    await fetch(`${deployment.apiUrls[0]}/v1/auth/me`, { headers: { authorization: `Bearer ${token}` } })
    const downAt = Date.now()
    for (const phase of phases) await runPhase(phase, deployment, token)
    proxies!.postgres.delay({ toServer: 0, toClient: 0 })
    proxies!.redis.delay({ toServer: 0, toClient: 0 })
    return { label: phases.map(phase => phase.label).join(', '), restarted: 'the near servers', upMeans: 'were near again', downAt, upAt: Date.now() }
  },
  report,
})
