/**
 * The well-behaved load of the abuse bench: each agent polls its events every `pollMs` and answers
 * what it finds (conversations with a reply, service requests with a response); each agent's
 * subscriber writes to it every few seconds. Every request is timed client-side.
 */
import type { WellBehavedAgent } from './abuse-seed.ts'
import { wallClock, type Recorder, type RequestKind } from './abuse-recorder.ts'

export interface WellBehavedOptions {
  api: string
  pollMs: number
  /** Each subscriber writes once in every [min, max) ms, at random. */
  messageEveryMs: [number, number]
  /** Every loop ends by then (wallClock), stopped or not. */
  deadline: number
}

export interface WellBehavedLoad {
  /** Ends every loop (each finishes the request it is in) and waits for them. */
  stop(): Promise<void>
}

interface Events {
  pendingConversations: { userId: string; latestMessageAt: string }[]
  serviceRequests: { requestId: string }[]
}

// A request that outlives this is counted as a failure, so no loop waits on one for ever.
const requestTimeoutMs = 15_000

export function startWellBehaved(agents: WellBehavedAgent[], recorder: Recorder, options: WellBehavedOptions): WellBehavedLoad {
  let stopped = false
  const running = () => !stopped && wallClock() < options.deadline
  const send = timedSender(options.api, recorder)
  const loops = agents.flatMap(agent => [agentLoop(agent, send, options, running), subscriberLoop(agent, send, options, running)])
  return {
    async stop() {
      stopped = true
      await Promise.all(loops)
    },
  }
}

type Send = (kind: RequestKind, method: string, path: string, headers: Record<string, string>, body?: unknown) => Promise<unknown>

/** Sends one request and records it; resolves with the parsed body of a 2xx, or null. */
function timedSender(api: string, recorder: Recorder): Send {
  return async (kind, method, path, headers, body) => {
    const startedAt = wallClock()
    let failure: string | null = null
    let parsed: unknown = null
    try {
      const response = await fetch(api + path, {
        method,
        headers: body === undefined ? headers : { ...headers, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(requestTimeoutMs),
      })
      const text = await response.text()
      if (response.ok) parsed = JSON.parse(text)
      else failure = String(response.status)
    } catch {
      failure = 'network'
    }
    recorder.record(kind, startedAt, wallClock() - startedAt, failure)
    return parsed
  }
}

async function agentLoop(agent: WellBehavedAgent, send: Send, options: WellBehavedOptions, running: () => boolean): Promise<void> {
  const headers = { 'x-api-key': agent.key }
  // What was answered: a conversation by its latest message (a newer one is answered again), a request once.
  const answered = new Map<string, string>()
  const responded = new Set<string>()
  await Bun.sleep(Math.random() * options.pollMs)
  while (running()) {
    const startedAt = wallClock()
    const polled = (await send('poll', 'GET', '/v1/agent/events', headers)) as { data: Events } | null
    for (const c of polled?.data.pendingConversations ?? []) {
      if (!running()) break
      if (answered.get(c.userId) === c.latestMessageAt) continue
      const text = `Answered at ${new Date().toISOString()}`
      if (await send('reply', 'POST', '/v1/agent/conversation-reply', headers, { userId: c.userId, text })) answered.set(c.userId, c.latestMessageAt)
    }
    for (const r of polled?.data.serviceRequests ?? []) {
      if (!running()) break
      if (responded.has(r.requestId)) continue
      const body = { requestId: r.requestId, output: 'Done.', success: true }
      // Answered or not (a 409: answered already), it is not asked again.
      await send('respond', 'POST', '/v1/agent/service-respond', headers, body)
      responded.add(r.requestId)
    }
    await Bun.sleep(Math.max(0, startedAt + options.pollMs - wallClock()))
  }
}

async function subscriberLoop(agent: WellBehavedAgent, send: Send, options: WellBehavedOptions, running: () => boolean): Promise<void> {
  const headers = { authorization: `Bearer ${agent.userToken}` }
  const [min, max] = options.messageEveryMs
  let n = 0
  for (;;) {
    // Sleeps in short steps, so a stop is heard soon.
    const wakeAt = wallClock() + min + Math.random() * (max - min)
    while (running() && wallClock() < wakeAt) await Bun.sleep(Math.min(250, wakeAt - wallClock()))
    if (!running()) return
    await send('message', 'POST', `/v1/conversations/${agent.id}/messages`, headers, { text: `Question ${++n}: how is it going?` })
  }
}
