/**
 * The convergence check's invariants, read once everything is healed and drained: every agent's poll
 * (on every API process) is what Postgres holds, every acknowledged write is stored exactly once, every
 * stored message and request told its recipient, and nothing waits in a mailbox or dead-letters.
 */
import { Redis } from 'ioredis'
import { createSql, type Sql } from '../../src/db.ts'
import type { Deployment } from './deployment.ts'
import type { EventStream } from './event-stream.ts'
import type { Client } from './http-client.ts'
import type { Mix, Population } from './convergence-mix.ts'

export interface Healed {
  deployment: Deployment
  redisUrl: string
  client: Client
  population: Population
  mix: Mix
  /** By user id (owners and users alike). */
  streams: Map<string, EventStream>
}

const drainWaitMs = 60_000
const settleWaitMs = 5_000
const deliveryWaitMs = 20_000

async function scanCount(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = []
  let cursor = '0'
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = next
    found.push(...keys)
  } while (cursor !== '0')
  return found
}

/** Waits until no actor is due, no mailbox holds mail and the outbox is empty; says what is left otherwise. */
export async function drain(run: Healed, sql: Sql, redis: Redis): Promise<string[]> {
  const prefix = run.deployment.redisPrefix
  const left = async () => {
    const due = await redis.zrange(`${prefix}{actors}:due`, 0, -1)
    const mailboxes = await scanCount(redis, `${prefix}{actor:*}:mailbox`)
    const [row] = await sql<{ n: number }[]>`select count(*)::int as n from outbox`
    return { due, mailboxes, outbox: row!.n }
  }
  const drained = (s: Awaited<ReturnType<typeof left>>) => !s.due.length && !s.mailboxes.length && !s.outbox
  const deadline = Date.now() + drainWaitMs
  let state = await left()
  while (!drained(state) && Date.now() < deadline) {
    await Bun.sleep(250)
    state = await left()
  }
  if (drained(state)) return []
  return [
    `not drained after ${drainWaitMs} ms: due ${JSON.stringify(state.due)}, mailboxes ${JSON.stringify(state.mailboxes)}, ` +
      `outbox rows ${state.outbox}`,
  ]
}

interface Expected {
  conversations: { userId: string; latestMessage: string; latestMessageAt: string; pendingCount: number }[]
  requests: { requestId: string; createdAt: string }[]
}

async function expectedInbox(sql: Sql, agentId: string): Promise<Expected> {
  const conversations = await sql<{ userId: string; latestMessage: string; latestMessageAt: Date; pendingCount: number }[]>`
    select user_id as "userId", latest_user_message as "latestMessage", latest_user_message_at as "latestMessageAt", pending_count as "pendingCount"
    from conversations where participant_id = ${agentId} and pending_count > 0
    order by latest_user_message_at, user_id`
  const requests = await sql<{ requestId: string; createdAt: Date }[]>`
    select id as "requestId", created_at as "createdAt" from service_requests
    where target_participant_id = ${agentId} and status = 'pending' and expires_at > now()
    order by created_at, id`
  return {
    conversations: conversations.map(c => ({ ...c, latestMessageAt: c.latestMessageAt.toISOString() })),
    requests: requests.map(r => ({ requestId: r.requestId, createdAt: r.createdAt.toISOString() })),
  }
}

/** Each agent's poll on each API process against Postgres; a wrong one is polled again for a few seconds before it counts. */
export async function checkPolls(run: Healed, sql: Sql): Promise<string[]> {
  const failures: string[] = []
  for (const [index, agent] of run.population.agents.entries()) {
    const expected = JSON.stringify(await expectedInbox(sql, agent.id))
    for (let api = 0; api < run.client.apiCount; api++) {
      const deadline = Date.now() + settleWaitMs
      let seen = ''
      let first = ''
      for (;;) {
        const polled = await run.client.call('poll', 'GET', '/v1/agent/events', { apiKey: agent.apiKey, api })
        const data = polled.body?.data
        seen =
          polled.status === 200
            ? JSON.stringify({
                conversations: data.pendingConversations,
                requests: data.serviceRequests.map((r: { requestId: string; createdAt: string }) => ({
                  requestId: r.requestId,
                  createdAt: r.createdAt,
                })),
              })
            : `${polled.status ?? polled.error} ${JSON.stringify(polled.body)}`
        first ||= seen
        if (seen === expected || Date.now() > deadline) break
        await Bun.sleep(200)
      }
      if (seen !== expected) failures.push(`agent ${index} on api-${api + 1}: the poll says\n      ${seen}\n    Postgres says\n      ${expected}`)
      else if (first !== expected) failures.push(`agent ${index} on api-${api + 1}: right only after a retry; first poll: ${first}`)
    }
  }
  return failures
}

/** Every acknowledged write stored once under the id it was acknowledged with; none stored twice. */
export async function checkStored(run: Healed, sql: Sql): Promise<string[]> {
  const failures: string[] = []
  const messages = run.mix.writes.filter(w => w.kind === 'message' || w.kind === 'reply')
  const texts = [...new Set(messages.map(w => w.text))]
  const rows = await sql<{ id: string; text: string; role: string }[]>`select id, text, role from messages where text in ${sql(texts)}`
  const byText = new Map<string, string[]>()
  for (const row of rows) byText.set(row.text, [...(byText.get(row.text) ?? []), row.id])
  for (const write of messages) {
    const ids = byText.get(write.text) ?? []
    const what = `${write.kind} ${write.key ?? '(no key)'}${write.repeats ? ' (a repeat)' : ''}`
    if (ids.length > 1) failures.push(`${what}: stored ${ids.length} times (${ids.join(', ')})`)
    if (write.acked && !ids.includes(write.id!)) failures.push(`${what}: acknowledged as ${write.id}, stored as ${JSON.stringify(ids)}`)
    if (write.repeats?.acked && write.acked && write.id !== write.repeats.id)
      failures.push(`${what}: answered ${write.id}, the first ${write.repeats.id}`)
  }
  const requests = run.mix.writes.filter(w => w.kind === 'service-request')
  const stored = await sql<{ id: string; input: string }[]>`select id, input from service_requests where input in ${sql(requests.map(w => w.text))}`
  for (const write of requests) {
    const found = stored.filter(row => row.input === write.text)
    if (found.length > 1) failures.push(`service request ${write.key}: stored ${found.length} times`)
    if (write.repeats?.acked && write.acked && write.id !== write.repeats.id)
      failures.push(`service request ${write.key} (a repeat): answered ${write.id}`)
    if (write.acked && found[0]?.id !== write.id)
      failures.push(`service request ${write.key}: acknowledged as ${write.id}, stored ${JSON.stringify(found)}`)
  }
  return failures
}

/** Each conversation's row agrees with its messages: the latest user message, and the count after the newest reply. */
export async function checkConversationRows(sql: Sql, agentIds: string[]): Promise<string[]> {
  const rows = await sql<{ agent: string; userId: string; pendingCount: number; counted: number; latest: string | null; newest: string | null }[]>`
    select c.participant_id as agent, c.user_id as "userId", c.pending_count as "pendingCount",
      (select count(*)::int from messages m where m.participant_id = c.participant_id and m.user_id = c.user_id and m.role = 'user'
        and m.created_at > coalesce((select max(created_at) from messages r
          where r.participant_id = c.participant_id and r.user_id = c.user_id and r.role = 'agent'), '-infinity')) as counted,
      c.latest_user_message as latest,
      (select text from messages m where m.participant_id = c.participant_id and m.user_id = c.user_id and m.role = 'user'
        order by created_at desc, seq desc limit 1) as newest
    from conversations c where c.participant_id in ${sql(agentIds)}`
  return rows
    .filter(r => r.pendingCount !== r.counted || r.latest !== r.newest)
    .map(
      r =>
        `conversation ${r.agent}/${r.userId}: pending_count ${r.pendingCount}, user messages after the newest reply ${r.counted}; latest ${r.latest} vs ${r.newest}`,
    )
}

/**
 * Every stored message and request told its recipient's stream (resumed after cuts), at least once:
 * delivery is at least once (src/events/relay.ts; a relay killed between Redis and its commit, or a
 * pass that failed, sends its events again), and clients deduplicate by the payload's ids.
 */
export async function checkEvents(run: Healed, sql: Sql): Promise<string[]> {
  const { agents } = run.population
  const ownerOf = new Map(agents.map(a => [a.id, a.owner.id]))
  const expected: { recipient: string; type: string; field: string; id: string }[] = []
  const messages = await sql<{ id: string; agent: string; userId: string; role: string }[]>`
    select id, participant_id as agent, user_id as "userId", role from messages where participant_id in ${sql(agents.map(a => a.id))}`
  for (const m of messages) {
    if (m.role === 'user') expected.push({ recipient: ownerOf.get(m.agent)!, type: 'conversation.message', field: 'messageId', id: m.id })
    else expected.push({ recipient: m.userId, type: 'conversation.reply', field: 'messageId', id: m.id })
  }
  const requests = await sql<{ id: string; from: string; to: string; status: string }[]>`
    select id, from_participant_id as from, target_participant_id as to, status from service_requests where target_participant_id in ${sql(agents.map(a => a.id))}`
  for (const r of requests) {
    expected.push({ recipient: ownerOf.get(r.to)!, type: 'service.requested', field: 'requestId', id: r.id })
    if (r.status === 'completed' || r.status === 'failed')
      expected.push({ recipient: ownerOf.get(r.from)!, type: `service.${r.status}`, field: 'requestId', id: r.id })
  }
  const copies = (e: (typeof expected)[number]) =>
    run.streams.get(e.recipient)!.events.filter(event => event.type === e.type && event.data?.[e.field] === e.id).length
  const deadline = Date.now() + deliveryWaitMs
  while (expected.some(e => copies(e) === 0) && Date.now() < deadline) await Bun.sleep(200)
  const failures: string[] = []
  for (const e of expected) {
    const n = copies(e)
    if (n === 0) failures.push(`${e.type} ${e.id}: never received by ${e.recipient}`)
  }
  return failures.length ? [`${failures.length} of ${expected.length} events never received:`, ...failures.slice(0, 40)] : []
}

/** Dead-lettered commands, each with what it was. */
export async function checkDeadLetters(run: Healed, redis: Redis): Promise<string[]> {
  const failures: string[] = []
  for (const key of await scanCount(redis, `${run.deployment.redisPrefix}{actor:*}:dead`)) {
    const entries = (await redis.xrange(key, '-', '+')) as [string, string[]][]
    for (const [id, fields] of entries) failures.push(`${key} ${id}: ${fields.join(' ').slice(0, 300)}`)
  }
  return failures
}

/** What the checks were about: how many conversations, messages, requests and events. */
async function extent(run: Healed, sql: Sql): Promise<string> {
  const ids = run.population.agents.map(a => a.id)
  const [row] = await sql<{ conversations: number; pending: number; messages: number; requests: number; open: number }[]>`
    select (select count(*)::int from conversations where participant_id in ${sql(ids)}) as conversations,
      (select count(*)::int from conversations where participant_id in ${sql(ids)} and pending_count > 0) as pending,
      (select count(*)::int from messages where participant_id in ${sql(ids)}) as messages,
      (select count(*)::int from service_requests where target_participant_id in ${sql(ids)}) as requests,
      (select count(*)::int from service_requests where target_participant_id in ${sql(ids)} and status = 'pending') as open`
  const events = [...run.streams.values()].reduce((n, stream) => n + stream.events.length, 0)
  return `${row!.conversations} conversations (${row!.pending} pending at the end), ${row!.messages} messages, ${row!.requests} service requests (${row!.open} open), ${events} events received`
}

/** Runs every check once the deployment is healed: the failures by check, each a line, and what was checked. */
export async function checkConvergence(run: Healed): Promise<{ failures: Record<string, string[]>; extent: string }> {
  const sql = createSql(run.deployment.databaseUrl, { max: 2 })
  const redis = new Redis(run.redisUrl, { maxRetriesPerRequest: 3 })
  try {
    const drained = await drain(run, sql, redis)
    const failures = {
      drained,
      polls: await checkPolls(run, sql),
      stored: await checkStored(run, sql),
      conversationRows: await checkConversationRows(
        sql,
        run.population.agents.map(a => a.id),
      ),
      events: await checkEvents(run, sql),
      deadLetters: await checkDeadLetters(run, redis),
    }
    return { failures, extent: await extent(run, sql) }
  } finally {
    redis.disconnect()
    await sql.end()
  }
}
