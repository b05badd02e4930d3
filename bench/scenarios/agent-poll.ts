/** Scenario 2, the agent poll: GET /v1/agent/events with a random agent's key per request. */
import { runLoad } from '../lib/load.ts'
import { alternate, measure } from '../lib/measure.ts'
import type { Server } from '../lib/proc.ts'
import type { SeededAgent } from '../lib/seed-agents.ts'
import type { LoadRun, PollRun, Settings } from '../lib/types.ts'

/**
 * Polls every agent once: builds its inbox (from Postgres, the first time) and caches its key; checks
 * that each sees its one pending conversation, or none, unless told not to.
 */
export async function warmAgents(api: Server, agents: SeededAgent[], concurrency = 64, check = true): Promise<number> {
  let next = 0
  let pendingSeen = 0
  const worker = async () => {
    while (next < agents.length) {
      const agent = agents[next++]!
      const response = await fetch(`${api.url}/v1/agent/events`, { headers: { 'x-api-key': agent.key } })
      if (response.status !== 200) throw new Error(`warm-up poll answered ${response.status}: ${await response.text()}`)
      const body = (await response.json()) as { data: { pendingConversations: unknown[] } }
      if (check && body.data.pendingConversations.length !== (agent.pending ? 1 : 0)) {
        throw new Error(`agent ${agent.id} polled ${body.data.pendingConversations.length} pending conversations`)
      }
      if (agent.pending) pendingSeen++
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  return pendingSeen
}

/**
 * Warms every agent and the process, then measures in `settings.rounds` turns with the baseline.
 * Returns the poll's runs as one and the baseline runs taken between them.
 */
export async function agentPollScenario(
  settings: Settings,
  api: Server,
  agents: SeededAgent[],
  baseline: (() => Promise<LoadRun>) | undefined,
): Promise<{ poll: PollRun; baselines: LoadRun[] }> {
  const pendingSeen = await warmAgents(api, agents)
  const next = () => ({ path: '/v1/agent/events', headers: { 'x-api-key': agents[Math.floor(Math.random() * agents.length)]!.key } })
  await runLoad({ url: api.url, connections: settings.connections, seconds: settings.warmSeconds, next })
  const perRound = settings.seconds / settings.rounds
  const { run, baselines } = await alternate(settings.rounds, () => measure(api.url, next, settings.connections, perRound, [api]), baseline)
  const pendingAgents = agents.filter(agent => agent.pending).length
  return { poll: { ...run, agents: agents.length, pendingAgents, pendingSeen }, baselines }
}
