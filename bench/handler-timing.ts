/** `bun bench/handler-timing.ts`: the poll's own cost per request in process (app.handle), against a bare Elysia route, with and without request metrics. */
// No HTTP server and no load generator, best of several rounds: a noisy machine disturbs it little.
import { Elysia } from 'elysia'
import { inProcess } from './lib/in-process.ts'
import { seedAgents } from './lib/seed-agents.ts'
import { createApp } from '../src/app.ts'

const agentCount = 10_000
const rounds = 8
const perRound = 50_000

await inProcess(async ({ world, deps, app }) => {
  const agents = await seedAgents(world.sql, { agents: agentCount, pendingEvery: 100, repliers: 0 })
  const polls = agents.map(a => new Request('http://bench.local/v1/agent/events', { headers: { 'x-api-key': a.key } }))
  // Every key cached and every inbox built (the first poll), then held in process (the second), as
  // after the bench's warm-up. The requests are reused, so their headers are parsed once: what Bun
  // spends on headers over a socket is not in these figures (bench/http-decompose.ts measures it).
  for (let pass = 0; pass < 2; pass++) for (const request of polls) await app.handle(request)
  const bare = new Elysia({ normalize: false }).get('/', () => ({ success: true, data: { pendingConversations: [], serviceRequests: [] } }))
  const bareRequests = agents.map(a => new Request('http://bench.local/', { headers: { 'x-api-key': a.key } }))
  // The same app where /metrics is served (behind a token): every request is timed (issue 27).
  const timed = createApp({
    ...deps,
    config: { ...deps.config, metrics: { port: undefined, token: 'handler-timing-token-of-32-characters', tokenPrevious: undefined } },
  })
  for (const request of polls.slice(0, 100)) await timed.handle(request)

  const best = { bare: Infinity, poll: Infinity, timed: Infinity }
  for (let round = 0; round < rounds; round++) {
    for (const [name, target, requests] of [
      ['bare', bare, bareRequests],
      ['poll', app, polls],
      ['timed', timed, polls],
    ] as const) {
      const started = performance.now()
      // A stride through the agents, so consecutive requests touch different cache entries.
      for (let i = 0; i < perRound; i++) await target.handle(requests[(i * 7919) % agentCount]!)
      best[name] = Math.min(best[name], ((performance.now() - started) * 1000) / perRound)
    }
  }
  console.log(`bare Elysia route        ${best.bare.toFixed(2)} µs a request`)
  console.log(`GET /v1/agent/events     ${best.poll.toFixed(2)} µs a request (${agentCount.toLocaleString('en-US')} agents, cached)`)
  console.log(`the same, request metrics on ${best.timed.toFixed(2)} µs a request (${(best.timed - best.poll).toFixed(2)} µs more)`)
  console.log(`best of ${rounds} rounds of ${perRound.toLocaleString('en-US')}, app.handle in process`)
})
