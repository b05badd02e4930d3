/** `bun bench/reply-timing.ts`: where a reply's CPU goes, in process (app.handle), free of the HTTP server and the load generator. */
// 64 callers at once, as in the bench (CALLERS=n for another count); rounds alternate between the
// three ways in, and each figure is the median of its rounds. CPU is this process's (all its threads)
// plus Postgres's backends and Redis. WAITING=1: as the bench's 3b, every reply answers a conversation
// that waits for it (in its agent's inbox, built before the rounds), each once.
import { inProcess } from './lib/in-process.ts'
import { seedAgents, seedWaitingConversations } from './lib/seed-agents.ts'
import { difference, resources } from './lib/resources.ts'
import { newRowId } from '../src/ids.ts'
import type { AgentReply, Replied } from '../src/conversations/replies.ts'

const callers = Number(process.env.CALLERS ?? 64)
if (!Number.isInteger(callers) || callers < 1) throw new Error('CALLERS takes a whole number of callers')
const rounds = 3
const seconds = 4
const waitingMode = process.env.WAITING === '1'

await inProcess(async ({ world, deps, app }) => {
  const agents = (await seedAgents(world.sql, { agents: 1000, pendingEvery: 100, repliers: 1000 })).filter(a => a.userId !== null)
  // The route with its write answered at once: what the HTTP layer (routing, key, body, envelope) costs.
  const send = deps.replies.send.bind(deps.replies)
  let answerAtOnce = false
  deps.replies.send = (reply: AgentReply) => {
    if (!answerAtOnce) return send(reply)
    const { messageId, userId, text } = reply
    return Promise.resolve<Replied>({ messageId, userId, text, createdAt: new Date().toISOString() })
  }

  let n = 0
  // Enough waiting conversations for 15,000 replies a second through every round that writes.
  const waiting = waitingMode
    ? await seedWaitingConversations(world.sql, agents, Math.ceil((15_000 * seconds * 2 * (rounds + 1)) / agents.length))
    : []
  if (waitingMode) {
    // Each agent's inbox built (a poll), so the replies take their conversations out of it.
    for (let i = 0; i < agents.length; i += 64) {
      await Promise.all(
        agents.slice(i, i + 64).map(async agent => {
          const response = await app.handle(new Request('http://bench.local/v1/agent/events', { headers: { 'x-api-key': agent.key } }))
          if (response.status !== 200) throw new Error(`poll answered ${response.status}`)
        }),
      )
    }
  }
  let taken = 0
  const pick = (): { id: string; key: string; userId: string | null } => {
    if (!waitingMode || answerAtOnce) return agents[Math.floor(Math.random() * agents.length)]!
    if (taken === waiting.length) throw new Error(`all ${waiting.length} waiting conversations were answered; seed more`)
    const c = waiting[taken++]!
    return { id: c.agentId, key: c.key, userId: c.userId }
  }
  const viaRoute = async () => {
    const agent = pick()
    const response = await app.handle(
      new Request('http://bench.local/v1/agent/conversation-reply', {
        method: 'POST',
        headers: { 'x-api-key': agent.key, 'content-type': 'application/json' },
        body: JSON.stringify({ userId: agent.userId, text: `Here is the summary, part ${++n}.` }),
      }),
    )
    if (response.status !== 201) throw new Error(`reply answered ${response.status}: ${await response.text()}`)
  }
  const viaWriter = async () => {
    const agent = pick()
    await send({ agentId: agent.id, userId: agent.userId!, text: `Here is the summary, part ${++n}.`, messageId: newRowId(), chosen: false })
  }
  const ways = {
    'route, write answered at once': () => ((answerAtOnce = true), viaRoute),
    'replies.send: statement, projection, notification': () => ((answerAtOnce = false), viaWriter),
    'route and write': () => ((answerAtOnce = false), viaRoute),
  }
  type Way = keyof typeof ways
  const figures = new Map<Way, { rate: number; process: number; postgres: number; redis: number }[]>()

  const measure = async (way: Way) => {
    const one = ways[way]()
    let count = 0
    const before = await resources(world)
    const cpu = process.cpuUsage()
    const started = performance.now()
    const end = started + seconds * 1000
    await Promise.all(
      Array.from({ length: callers }, async () => {
        while (performance.now() < end) {
          await one()
          count++
        }
      }),
    )
    const elapsed = (performance.now() - started) / 1000
    const used = process.cpuUsage(cpu)
    const cost = difference(await resources(world), before)
    return {
      rate: count / elapsed,
      process: (used.user + used.system) / count,
      postgres: (cost.pgCpuSeconds * 1e6) / count,
      redis: (cost.redisCpuSeconds * 1e6) / count,
    }
  }

  await measure('route and write') // warm-up: keys cached, code compiled
  for (let round = 0; round < rounds; round++) {
    for (const way of Object.keys(ways) as Way[]) {
      const list = figures.get(way) ?? []
      list.push(await measure(way))
      figures.set(way, list)
      await Bun.sleep(500) // commands cut off by the round's end land before the next
    }
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
  console.log(`${callers} callers, median of ${rounds} rounds of ${seconds} s; CPU µs a reply`)
  console.log('| way in | replies/s | this process | Postgres | Redis |')
  console.log('|---|---:|---:|---:|---:|')
  for (const [way, list] of figures) {
    const f = (key: 'rate' | 'process' | 'postgres' | 'redis') => median(list.map(x => x[key]))
    console.log(
      `| ${way} | ${Math.round(f('rate')).toLocaleString('en-US')} | ${f('process').toFixed(0)} | ${f('postgres').toFixed(0)} | ${f('redis').toFixed(0)} |`,
    )
  }
})
