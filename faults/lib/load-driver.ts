/**
 * The load a scenario runs under, per pair: the user writes to the agent, the agent polls its events
 * and replies to what waits, the agent makes proxy calls, and new users sign in and subscribe to the
 * agent's plan (an event to its owner committed with no actor, so none waits for Redis). Every write carries an Idempotency-Key
 * and is retried under the same key (after a 503, a 409 "in progress", or no answer) until it is
 * acknowledged with a 2xx, refused otherwise, or given up after a while.
 */
import type { Attempt, Client } from './http-client.ts'
import { randomBytes } from 'node:crypto'
import { userToken, type Pair } from './population.ts'

export type WriteKind = 'message' | 'reply' | 'proxy' | 'subscription'

export const writeKinds: WriteKind[] = ['message', 'reply', 'proxy', 'subscription']

export interface WriteRecord {
  kind: WriteKind
  pair: number
  key: string
  /** The text stored (messages and replies carry their key in it, so a copy is found by text). */
  text: string
  /** A subscription's subscriber. */
  userId?: string
  attempts: Attempt[]
  /** The 2xx attempt, if one came. */
  acked?: Attempt
  /** The stored message's id, from the acknowledgement. */
  ackedId?: string
  /** Why no acknowledgement: another status (refused), or retries ran out (gave up). */
  unacked?: 'refused' | 'gave up'
}

export interface Load {
  writes: WriteRecord[]
  /** Agents' polls and new users' sign-ins: not writes under a key, but their answers count too. */
  polls: Attempt[]
  startedAt: number
  /** Starts no new writes; waits for the ones under way to be acknowledged, refused or given up. */
  stop(): Promise<void>
}

const pace = { message: 300, poll: 250, proxy: 400, subscription: 1000 }
const retryDelayMs = 150
const maxRetryDelayMs = 1000
/**
 * How long one key is retried before it is given up: past a first attempt that waited out an actor's
 * answer (10 s) in a process then killed, the lease on its key (10 s) that answers retries 409 in
 * progress until it lapses, and the actor's answer to the retry that takes it over (10 s).
 */
export const giveUpAfterMs = 35_000

function retryable(attempt: Attempt): boolean {
  if (attempt.status === undefined) return true
  return attempt.status === 503 || (attempt.status === 409 && attempt.body?.error === 'idempotency_key_in_progress')
}

export function startLoad(client: Client, pairs: Pair[], jwtSecret: string): Load {
  const writes: WriteRecord[] = []
  const polls: Attempt[] = []
  let stopping = false
  const startedAt = Date.now()
  let sequence = 0

  const send = async (record: WriteRecord, call: () => Promise<Attempt>) => {
    writes.push(record)
    const first = Date.now()
    for (;;) {
      const attempt = await call()
      record.attempts.push(attempt)
      if (attempt.status !== undefined && attempt.status >= 200 && attempt.status < 300) {
        record.acked = attempt
        record.ackedId = attempt.body?.data?.id ?? attempt.body?.data?.messageId
        return
      }
      if (!retryable(attempt)) {
        record.unacked = 'refused'
        return
      }
      if (Date.now() - first > giveUpAfterMs) {
        record.unacked = 'gave up'
        return
      }
      await Bun.sleep(Math.min(maxRetryDelayMs, attempt.retryAfterS ? attempt.retryAfterS * 1000 : retryDelayMs))
    }
  }

  const newKey = (kind: WriteKind, pair: Pair) => `${kind}-${pair.index}-${++sequence}`

  const userWrites = async (pair: Pair) => {
    while (!stopping) {
      const key = newKey('message', pair)
      const text = `message ${key}`
      const record: WriteRecord = { kind: 'message', pair: pair.index, key, text, attempts: [] }
      await send(record, () =>
        client.call('message', 'POST', `/v1/conversations/${pair.agent.id}/messages`, { token: pair.user.token, key, body: { text } }),
      )
      await Bun.sleep(pace.message)
    }
  }

  const agentReplies = async (pair: Pair) => {
    while (!stopping) {
      const poll = await client.call('poll', 'GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })
      polls.push(poll)
      const waiting: { userId: string }[] = poll.status === 200 ? poll.body.data.pendingConversations : []
      for (const conversation of waiting) {
        if (stopping) break
        const key = newKey('reply', pair)
        const text = `reply ${key}`
        const record: WriteRecord = { kind: 'reply', pair: pair.index, key, text, attempts: [] }
        await send(record, () =>
          client.call('reply', 'POST', '/v1/agent/conversation-reply', {
            apiKey: pair.agent.apiKey,
            key,
            body: { userId: conversation.userId, text },
          }),
        )
      }
      await Bun.sleep(pace.poll)
    }
  }

  const agentCalls = async (pair: Pair) => {
    while (!stopping) {
      const key = newKey('proxy', pair)
      // The key travels to the upstream too, so the calls it received can be counted per key.
      const record: WriteRecord = { kind: 'proxy', pair: pair.index, key, text: key, attempts: [] }
      await send(record, () =>
        client.call('proxy', 'POST', '/v1/agent/proxy-call', {
          apiKey: pair.agent.apiKey,
          key,
          body: { userId: pair.user.id, provider: 'acme', method: 'POST', path: '/echo', body: { key } },
        }),
      )
      await Bun.sleep(pace.proxy)
    }
  }

  const subscribersJoin = async (pair: Pair) => {
    while (!stopping) {
      const key = newKey('subscription', pair)
      const token = await userToken(jwtSecret, `joiner-${key}-${randomBytes(3).toString('hex')}`)
      // The first request with a new token creates the user; retried like a write until it answers.
      let userId: string | undefined
      const first = Date.now()
      while (!userId && !stopping && Date.now() - first < giveUpAfterMs) {
        const me = await client.call('sign-in', 'GET', '/v1/auth/me', { token })
        polls.push(me)
        if (me.status === 200) userId = me.body.data.id
        else await Bun.sleep(retryDelayMs)
      }
      if (!userId) continue
      const record: WriteRecord = { kind: 'subscription', pair: pair.index, key, text: key, userId, attempts: [] }
      await send(record, () => client.call('subscription', 'POST', '/v1/billing/subscriptions', { token, key, body: { planId: pair.planId } }))
      await Bun.sleep(pace.subscription)
    }
  }

  const loops = pairs.flatMap(pair => [userWrites(pair), agentReplies(pair), agentCalls(pair), subscribersJoin(pair)])
  return {
    writes,
    polls,
    startedAt,
    async stop() {
      stopping = true
      await Promise.all(loops)
    },
  }
}
