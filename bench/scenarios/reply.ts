/**
 * Scenario 3, replies: POST /v1/agent/conversation-reply from a random one of 1,000 agents, each to
 * its one conversation (answered from the first reply on, as an agent's follow-ups are); and 3b, each
 * reply to a conversation that waits for it (a user's message the agent has seen in its inbox), every
 * one answered once.
 */
import { runLoad } from '../lib/load.ts'
import { difference, resources } from '../lib/resources.ts'
import type { World } from '../lib/world.ts'
import { alternate, measure } from '../lib/measure.ts'
import type { Server } from '../lib/proc.ts'
import type { SeededAgent, WaitingConversation } from '../lib/seed-agents.ts'
import type { LoadRun, ReplyRun, Settings } from '../lib/types.ts'

export async function replyScenario(
  settings: Settings,
  servers: { api: Server; workers: Server },
  world: World,
  agents: SeededAgent[],
  baseline: (() => Promise<LoadRun>) | undefined,
  /** Replies take these in turn, each once (3b); without them, a random replier's one conversation (3). */
  waiting?: WaitingConversation[],
): Promise<{ reply: ReplyRun; baselines: LoadRun[] }> {
  const { api, workers } = servers
  const { sql } = world
  const repliers = agents.filter(agent => agent.userId !== null).slice(0, 1000)
  let n = 0
  let taken = 0
  const to = (key: string, userId: string) => ({
    method: 'POST' as const,
    path: '/v1/agent/conversation-reply',
    headers: { 'x-api-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ userId, text: `Here is the summary, part ${++n}.` }),
  })
  const next = waiting
    ? () => {
        if (taken === waiting.length) throw new Error(`all ${waiting.length} waiting conversations were answered; seed more`)
        const c = waiting[taken++]!
        return to(c.key, c.userId)
      }
    : () => {
        const agent = repliers[Math.floor(Math.random() * repliers.length)]!
        return to(agent.key, agent.userId!)
      }
  const recorded = async () => {
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from messages where role = 'agent'`
    return row!.n
  }
  await runLoad({ url: api.url, connections: settings.connections, seconds: settings.warmSeconds, next })
  // Commands of requests cut off when a run ends still land; let them before counting or measuring.
  const settle = () => Bun.sleep(1000)
  await settle()
  const before = await recorded()
  const used = await resources(world)
  const perRound = settings.seconds / settings.rounds
  const { run, baselines } = await alternate(
    settings.rounds,
    async () => {
      const round = await measure(api.url, next, settings.connections, perRound, [api, workers])
      await settle()
      return round
    },
    baseline,
  )
  const replies = (await recorded()) - before
  const cost = difference(await resources(world), used)
  const busy = (role: string) => (run.processes[role]!.cpu * run.load.seconds * 1e6) / replies
  const perReply = {
    apiUs: busy('api'),
    workersUs: busy('workers'),
    postgresUs: (cost.pgCpuSeconds * 1e6) / replies,
    redisUs: (cost.redisCpuSeconds * 1e6) / replies,
    redisCommands: cost.redisCommands / replies,
    pgTransactions: cost.pgTransactions / replies,
  }
  return { reply: { ...run, agents: repliers.length, recorded: replies, perReply, answered: waiting ? taken : undefined }, baselines }
}
