/**
 * The convergence check's population and its seeded, random mix of operations: users writing to
 * the agents they subscribe to, agents polling and replying (with and without an Idempotency-Key,
 * some keys sent again), agents asking each other for work and answering. Every answer is kept.
 */
import type { Attempt, AttemptKind, Client } from './http-client.ts'
import { signIn, type Person } from './population.ts'
import type { Random } from '../../test/helpers/seeded.ts'

export interface Agent {
  id: string
  name: string
  apiKey: string
  owner: Person
}

export interface Population {
  agents: Agent[]
  users: Person[]
  /** By user id: the indexes of the agents they subscribe to. */
  subscribed: Map<string, number[]>
}

function data(attempt: Attempt, status: number, what: string) {
  if (attempt.status !== status)
    throw new Error(`${what} failed before any fault: ${attempt.status ?? attempt.error} ${JSON.stringify(attempt.body)}`)
  return attempt.body.data
}

/** Agents (each with its own owner and plan) and users, each subscribed to `perUser` of them. */
export async function createPopulation(
  client: Client,
  secret: string,
  random: Random,
  counts: { agents: number; users: number; perUser: number },
  tag: string,
): Promise<Population> {
  const made = await Promise.all(
    Array.from({ length: counts.agents }, async (_, index) => {
      const owner = await signIn(client, secret, `owner-${index}-${tag}`)
      const created = data(
        await client.call('setup', 'POST', '/v1/participants', { token: owner.token, body: { name: `conv-agent-${index}-${tag}` } }),
        201,
        'agent creation',
      )
      const plan = await client.call('setup', 'POST', '/v1/billing/plans', {
        token: owner.token,
        body: { participantId: created.id, name: 'Convergence', monthlyPriceCents: 100, includedProxyCalls: 1000, overagePerCallCents: 1 },
      })
      return { agent: { id: created.id, name: created.name, apiKey: created.apiKey, owner }, planId: data(plan, 201, 'plan creation').id }
    }),
  )
  const users: Person[] = []
  const subscribed = new Map<string, number[]>()
  for (let index = 0; index < counts.users; index++) {
    const chosen = new Set<number>()
    while (chosen.size < Math.min(counts.perUser, counts.agents)) chosen.add(random.int(counts.agents))
    const user = await signIn(client, secret, `user-${index}-${tag}`)
    for (const agent of chosen) {
      const planId = made[agent]!.planId
      data(await client.call('setup', 'POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } }), 201, 'subscription')
    }
    users.push(user)
    subscribed.set(user.id, [...chosen])
  }
  return { agents: made.map(m => m.agent), users, subscribed }
}

export type WriteKind = 'message' | 'reply' | 'service-request' | 'service-respond'

export interface Write {
  kind: WriteKind
  /** Sent under an Idempotency-Key (retried under it until answered), or once without. */
  key?: string
  /** Unique to this write (a repeat of a key sends the same): how its copies are found in Postgres. */
  text: string
  agent: number
  userId?: string
  requestId?: string
  /** A key sent again later (after its first answer): the write it repeats. */
  repeats?: Write
  attempts: Attempt[]
  acked?: Attempt
  /** The id the acknowledgement names (the message's or the request's). */
  id?: string
}

export interface Mix {
  writes: Write[]
  polls: Attempt[]
  /** Starts no new operation and waits for those under way. */
  stop(): Promise<void>
}

/** Answers a write may get without anything being wrong (a 503 or a key in progress are retried when keyed). */
const fine = (kind: WriteKind, attempt: Attempt) => {
  const s = attempt.status
  if (s === undefined || s === 503 || s === 429) return true
  if (s === 409 && attempt.body?.error === 'idempotency_key_in_progress') return true
  if (kind === 'reply' && s === 404) return true // to a user whose message is not stored (yet, or at all)
  if (kind === 'service-respond' && s === 409 && attempt.body?.error === 'already_responded') return true
  return s >= 200 && s < 300
}
const retryable = (attempt: Attempt) =>
  attempt.status === undefined || attempt.status === 503 || (attempt.status === 409 && attempt.body?.error === 'idempotency_key_in_progress')

const giveUpAfterMs = 30_000

/** Runs the mix with `loops` concurrent clients until stopped. */
export function startMix(client: Client, population: Population, random: Random, loops: number): Mix {
  const writes: Write[] = []
  const polls: Attempt[] = []
  /** Acknowledged keyed writes, with how to send them again. */
  const repeatable: { write: Write; again: (api: number) => Promise<Attempt> }[] = []
  const openRequests: Write[] = []
  let stopping = false
  let sequence = 0
  const { agents, users } = population

  const send = async (write: Write, call: (api: number) => Promise<Attempt>) => {
    writes.push(write)
    await sendOnly(write, call)
    if (write.key && write.acked && !write.repeats) repeatable.push({ write, again: call })
  }
  const sendOnly = async (write: Write, call: (api: number) => Promise<Attempt>) => {
    const first = Date.now()
    for (;;) {
      const attempt = await call(random.int(client.apiCount))
      write.attempts.push(attempt)
      if (attempt.status !== undefined && attempt.status >= 200 && attempt.status < 300) {
        write.acked = attempt
        write.id = attempt.body?.data?.messageId ?? attempt.body?.data?.id ?? attempt.body?.data?.requestId
        return
      }
      if (!write.key || !retryable(attempt) || Date.now() - first > giveUpAfterMs) return
      await Bun.sleep(attempt.retryAfterS ? Math.min(1000, attempt.retryAfterS * 1000) : 150)
    }
  }
  const call =
    (kind: AttemptKind, path: string, auth: { token?: string; apiKey?: string }, body: unknown, key: string | undefined) => (api: number) =>
      client.call(kind, 'POST', path, { ...auth, body, key, api })

  const message = async () => {
    const user = random.pick(users)
    const agent = random.pick(population.subscribed.get(user.id)!)
    const key = random.chance(0.7) ? `m-${++sequence}` : undefined
    const text = `message ${key ?? `u-${++sequence}`} ${random.int(1e9)}`
    const write: Write = { kind: 'message', key, text, agent, userId: user.id, attempts: [] }
    await send(write, call('message', `/v1/conversations/${agents[agent]!.id}/messages`, { token: user.token }, { text }, key))
  }

  const reply = async (agent: number, userId: string) => {
    const key = random.chance(0.6) ? `r-${++sequence}` : undefined
    const text = `reply ${key ?? `u-${++sequence}`} ${random.int(1e9)}`
    const write: Write = { kind: 'reply', key, text, agent, userId, attempts: [] }
    await send(write, call('reply', '/v1/agent/conversation-reply', { apiKey: agents[agent]!.apiKey }, { userId, text }, key))
  }

  /** A keyed write sent again, same key and body: the first answer again, nothing stored twice. */
  const repeat = async () => {
    const { write: first, again } = random.pick(repeatable)
    const write: Write = { ...first, repeats: first, attempts: [], acked: undefined, id: undefined }
    await send(write, again)
  }

  const request = async () => {
    const from = random.int(agents.length)
    const to = (from + 1 + random.int(agents.length - 1)) % agents.length
    const key = `q-${++sequence}`
    const text = `input ${key} ${random.int(1e9)}`
    const write: Write = { kind: 'service-request', key, text, agent: to, attempts: [] }
    const body = { targetAgentId: agents[to]!.id, serviceTag: 'convergence', input: text }
    await send(write, call('service-request', '/v1/agent/service-requests', { apiKey: agents[from]!.apiKey }, body, key))
    if (write.acked) openRequests.push(write)
  }

  const respond = async (requestId: string, agent: number) => {
    const key = `a-${++sequence}`
    const write: Write = { kind: 'service-respond', key, text: `output ${key}`, agent, requestId, attempts: [] }
    const body = { requestId, output: write.text, success: random.chance(0.8) }
    await send(write, call('service-respond', '/v1/agent/service-respond', { apiKey: agents[agent]!.apiKey }, body, key))
  }

  /** An agent's loop step: poll (now and then with `since`), then answer some of what it found. */
  const agentStep = async () => {
    const agent = random.int(agents.length)
    const since = random.chance(0.15) ? new Date(Date.now() - random.int(5000)).toISOString() : undefined
    const path = `/v1/agent/events${since ? `?since=${encodeURIComponent(since)}` : ''}`
    const polled = await client.call('poll', 'GET', path, { apiKey: agents[agent]!.apiKey, api: random.int(client.apiCount) })
    polls.push(polled)
    if (polled.status !== 200) return
    const { pendingConversations, serviceRequests } = polled.body.data as {
      pendingConversations: { userId: string }[]
      serviceRequests: { requestId: string }[]
    }
    for (const c of pendingConversations) if (random.chance(0.5)) await reply(agent, c.userId)
    for (const r of serviceRequests) if (random.chance(0.5)) await respond(r.requestId, agent)
  }

  const step = async () => {
    const roll = random.next()
    if (roll < 0.35) return message()
    if (roll < 0.65) return agentStep()
    if (roll < 0.75) {
      // A reply straight to one of the agent's subscribers, pending or not (or never written: 404).
      const user = random.pick(users)
      return reply(random.pick(population.subscribed.get(user.id)!), user.id)
    }
    if (roll < 0.82 && repeatable.length > 0) return repeat()
    if (roll < 0.9) return request()
    const open = openRequests.length > 0 ? openRequests.splice(random.int(openRequests.length), 1)[0]! : undefined
    if (open) return respond(open.id!, open.agent)
  }

  const running = Array.from({ length: loops }, async () => {
    while (!stopping) {
      await step()
      await Bun.sleep(20 + random.int(80))
    }
  })
  return {
    writes,
    polls,
    async stop() {
      stopping = true
      await Promise.all(running)
    },
  }
}

/** Answers that should not happen whatever the faults: a 500, or a refusal the mix cannot explain. */
export function unexpectedAnswers(mix: Mix): string[] {
  const out: string[] = []
  for (const write of mix.writes) {
    for (const attempt of write.attempts) {
      if (!fine(write.kind, attempt))
        out.push(`${write.kind} ${write.key ?? '(no key)'}: ${attempt.status} ${JSON.stringify(attempt.body).slice(0, 200)}`)
    }
  }
  for (const poll of mix.polls) {
    if (poll.status !== undefined && poll.status !== 200 && poll.status !== 503)
      out.push(`poll: ${poll.status} ${JSON.stringify(poll.body).slice(0, 200)}`)
  }
  return out
}
