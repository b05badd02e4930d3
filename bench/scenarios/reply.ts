/**
 * Scenario 3, replies: POST /v1/agent/conversation-reply from a random one of 1,000 agents, each to
 * its one conversation (answered from the first reply on, as an agent's follow-ups are); and 3b, each
 * reply to a conversation that waits for it (a user's message the agent has seen in its inbox), every
 * one answered once.
 */
import { createKeys } from '../../src/keys.ts'
import { invalidateInbox } from '../../src/conversations/inbox.ts'
import { alternate, measure, warmUp, type Bench } from '../lib/measure.ts'
import type { Server } from '../lib/proc.ts'
import { seedWaitingConversations, type SeededAgent, type WaitingConversation } from '../lib/seed-agents.ts'
import { warmAgents } from './agent-poll.ts'
import type { LoadRun, ReplyRun } from '../lib/types.ts'
import { writeLines, type Requests, type Taken } from '../lib/wrk.ts'

export async function replyScenario(
  bench: Bench,
  api: Server,
  agents: SeededAgent[],
  baseline: (() => Promise<LoadRun>) | undefined,
  /** Replies take these in turn, each once (3b); without them, a random replier's one conversation (3). */
  waiting?: WaitingConversation[],
): Promise<{ reply: ReplyRun; baselines: LoadRun[] }> {
  const { settings, world } = bench
  const repliers = agents.filter(agent => agent.userId !== null).slice(0, 1000)
  const lines = waiting
    ? writeLines(
        'reply-waiting',
        waiting.map(c => `${c.key}\t${c.userId}`),
      )
    : writeLines(
        'reply',
        repliers.map(agent => `${agent.key}\t${agent.userId}`),
      )
  // 3b goes on through the lines from where the last run stopped.
  let first = 0
  let answered = 0
  const requests = (): Requests => ({
    path: '/v1/agent/conversation-reply',
    kind: 'reply',
    lines,
    order: waiting ? 'once' : 'random',
    first,
    statuses: true,
  })
  const took = (taken: Taken) => {
    if (taken.exhausted) throw new Error(`all ${lines.count} waiting conversations were answered; seed more`)
    first = taken.next
    answered += taken.taken
  }
  const recorded = async () => {
    const [row] = await world.sql<{ n: number }[]>`select count(*)::int as n from messages where role = 'agent'`
    return row!.n
  }
  took(await warmUp(bench, api, requests()))
  // Commands of requests cut off when a run ends still land; let them before counting or measuring.
  const settle = () => Bun.sleep(1000)
  await settle()
  const before = await recorded()
  const perRound = settings.seconds / settings.rounds
  const { run, baselines } = await alternate(
    settings.rounds,
    async () => {
      const round = await measure(bench, api, requests(), perRound)
      took(round.taken)
      await settle()
      return round.run
    },
    baseline,
  )
  const replies = (await recorded()) - before
  const per = (seconds = 0) => (seconds * 1e6) / replies
  const perReply = {
    apiUs: per(run.cpuSeconds.api),
    workersUs: per(run.cpuSeconds.workers),
    postgresUs: per(run.cpuSeconds.postgres),
    redisUs: per(run.cpuSeconds.redis),
    redisCommands: run.counts.redisCommands / replies,
    pgTransactions: run.counts.pgTransactions / replies,
  }
  return { reply: { ...run, agents: repliers.length, recorded: replies, perReply, answered: waiting ? answered : undefined }, baselines }
}

/**
 * For 3b: enough waiting conversations for 20,000 replies a second through the warm-up and the
 * rounds, spread over the 1,000 repliers, and each replier's inbox rebuilt with them (two polls each).
 */
export async function prepareWaiting(
  bench: Bench,
  api: Server,
  agents: SeededAgent[],
  progress: (line: string) => void,
): Promise<WaitingConversation[]> {
  const { settings, world } = bench
  const repliers = agents.filter(agent => agent.userId !== null).slice(0, 1000)
  const users = Math.ceil((20_000 * (settings.warmSeconds + settings.seconds)) / repliers.length)
  const seeding = performance.now()
  const waiting = await seedWaitingConversations(world.sql, repliers, users)
  // Seeded past the service: their inboxes (built by an earlier poll, if any) are rebuilt from Postgres.
  const keys = createKeys(world.redisPrefix)
  // This process reads no inbox: nothing here to tell at once.
  const here = { redis: world.redis, keys, pubsub: { deliver: () => {} } }
  for (const agent of repliers) await invalidateInbox(here, agent.id)
  await Bun.sleep(200) // the API's inbox caches hear of it
  await warmAgents(api, repliers, 64, false)
  const built = await Promise.all(repliers.map(agent => world.redis.exists(keys.agent(agent.id).built)))
  if (built.some(n => n !== 1)) throw new Error(`${built.filter(n => n !== 1).length} of the repliers' inboxes were not rebuilt`)
  const took = ((performance.now() - seeding) / 1000).toFixed(1)
  progress(
    `reply to waiting conversations: ${waiting.length} seeded and ${repliers.length} inboxes built in ${took} s; ${settings.rounds} × ${settings.seconds / settings.rounds} s`,
  )
  return waiting
}
