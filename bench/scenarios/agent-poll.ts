/** Scenario 2, the agent poll: GET /v1/agent/events with a random agent's key per request, at one number of agents. */
import { alternate, measure, warmUp, type Bench } from '../lib/measure.ts'
import { memory, type Server } from '../lib/proc.ts'
import type { SeededAgent } from '../lib/seed-agents.ts'
import type { LoadRun, PollRun } from '../lib/types.ts'
import { writeLines, type Requests } from '../lib/wrk.ts'

/**
 * Polls every agent twice: the first poll builds its inbox (from Postgres, the first time) and caches
 * its key, and checks that it sees its one pending conversation, or none, unless told not to; the
 * second puts the inbox in the API's memory. (The inbox reader never keeps an inbox it rebuilt,
 * nor one read while a change was announced, as each rebuild's is. With one poll each, an agent's
 * second poll, its first under load, read Redis: at 100,000 agents, a third to a half of the
 * measured polls, as the rounds began before wrk had reached them all.)
 */
export async function warmAgents(api: Server, agents: SeededAgent[], concurrency = 64, check = true): Promise<number> {
  let next = 0
  let pendingSeen = 0
  const worker = async (first: boolean) => {
    while (next < agents.length) {
      const agent = agents[next++]!
      const response = await fetch(`${api.url}/v1/agent/events`, { headers: { 'x-api-key': agent.key } })
      if (response.status !== 200) throw new Error(`warm-up poll answered ${response.status}: ${await response.text()}`)
      const body = (await response.json()) as { data: { pendingConversations: unknown[] } }
      if (!first) continue
      if (check && body.data.pendingConversations.length !== (agent.pending ? 1 : 0)) {
        throw new Error(`agent ${agent.id} polled ${body.data.pendingConversations.length} pending conversations`)
      }
      if (agent.pending) pendingSeen++
    }
  }
  for (const first of [true, false]) {
    next = 0
    // The first pass's announcements reach the API before the second pass reads: a read that one
    // overlaps is not kept (a few could still be; wrk's warm-up polls them again).
    if (!first) await Bun.sleep(200)
    await Promise.all(Array.from({ length: concurrency }, () => worker(first)))
  }
  return pendingSeen
}

/**
 * On a fresh API process: every agent polled twice (inbox built and held, key cached), then wrk's
 * warm-up, then `settings.rounds` turns with the baseline. The API's RSS before and after gives the
 * memory a cached agent takes. Returns the poll's runs as one and the baseline runs taken between
 * them.
 */
export async function agentPollScenario(
  bench: Bench,
  api: Server,
  agents: SeededAgent[],
  baseline: (() => Promise<LoadRun>) | undefined,
): Promise<{ poll: PollRun; baselines: LoadRun[] }> {
  const { settings } = bench
  const rssBeforeMb = memory(api.pid).rssMb
  const pendingSeen = await warmAgents(api, agents)
  const requests: Requests = {
    path: '/v1/agent/events',
    kind: 'get',
    lines: writeLines(
      `poll-${agents.length}`,
      agents.map(agent => agent.key),
    ),
    order: 'random',
  }
  await warmUp(bench, api, requests)
  const perRound = settings.seconds / settings.rounds
  const { run, baselines } = await alternate(settings.rounds, async () => (await measure(bench, api, requests, perRound)).run, baseline)
  const pendingAgents = agents.filter(agent => agent.pending).length
  const rssAfterMb = memory(api.pid).rssMb
  return { poll: { ...run, agents: agents.length, pendingAgents, pendingSeen, rssBeforeMb, rssAfterMb }, baselines }
}
