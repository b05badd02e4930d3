/**
 * Check: every acknowledged write is in Postgres exactly once. Messages and replies are found by
 * their text (which carries the Idempotency-Key): one row with the acknowledged id, and no write, even
 * one never acknowledged, stored twice. Subscriptions are found by their new subscriber: one row, with
 * the acknowledged id. Proxy calls are counted per subscription: at least one usage
 * event per acknowledged call, at most one per key that reached the fake upstream (the contract meters
 * a call once per key however often it is retried), and the period's counter agrees. A call that
 * reached the upstream but was never acknowledged may be metered later than this looks (at a retry
 * after the service takes its abandoned key over), so it is counted in the upper bound only.
 */
import { createSql } from '../../src/db.ts'
import { describeAttempt } from './http-client.ts'
import { phase, type ScenarioRun } from './scenario-run.ts'

interface MessageRow {
  id: string
  text: string
  role: string
  participantId: string
  userId: string
}

/** How long metering may take to catch up after the load stops. */
const meteringWaitMs = 20_000

export async function checkWrites(run: ScenarioRun): Promise<string[]> {
  const sql = createSql(run.deployment.databaseUrl, { max: 1 })
  try {
    return [...(await checkMessages(run, sql)), ...(await checkSubscriptions(run, sql)), ...(await checkProxyCalls(run, sql))]
  } finally {
    await sql.end()
  }
}

async function checkMessages(run: ScenarioRun, sql: ReturnType<typeof createSql>): Promise<string[]> {
  const failures: string[] = []
  const rows = await sql<MessageRow[]>`
    select id, text, role, participant_id as "participantId", user_id as "userId" from messages
  `
  const byText = Map.groupBy(rows, row => row.text)
  for (const write of run.load.writes) {
    if (write.kind !== 'message' && write.kind !== 'reply') continue
    const found = byText.get(write.text) ?? []
    const pair = run.pairs[write.pair]!
    const role = write.kind === 'message' ? 'user' : 'agent'
    const acked = write.acked
      ? `acknowledged ${describeAttempt(write.acked, run.load.startedAt)} (${phase(run, write.acked.endedAt)}) as id ${write.ackedId}`
      : 'never acknowledged'
    const retries = write.attempts.length > 1 ? `, after ${write.attempts.length - 1} retries under its key` : ''
    if (found.length > 1) {
      failures.push(
        `${write.kind} ${write.key} is stored ${found.length} times (ids ${found.map(row => row.id).join(', ')}); it was ${acked}${retries}`,
      )
      continue
    }
    if (!write.acked) continue
    const [row] = found
    if (!row) {
      failures.push(`${write.kind} ${write.key} was ${acked}${retries}, but no such message is in Postgres: an acknowledged write was lost`)
    } else if (row.id !== write.ackedId) {
      failures.push(`${write.kind} ${write.key} was ${acked}${retries}, but is stored as id ${row.id}`)
    } else if (row.role !== role || row.participantId !== pair.agent.id || row.userId !== pair.user.id) {
      failures.push(`${write.kind} ${write.key} is stored in the wrong conversation or role: ${JSON.stringify(row)}`)
    }
  }
  return failures
}

async function checkSubscriptions(run: ScenarioRun, sql: ReturnType<typeof createSql>): Promise<string[]> {
  const failures: string[] = []
  const rows = await sql<{ id: string; userId: string; participantId: string }[]>`
    select id, user_id as "userId", participant_id as "participantId" from subscriptions
  `
  const byUser = Map.groupBy(rows, row => row.userId)
  for (const write of run.load.writes) {
    if (write.kind !== 'subscription') continue
    const found = byUser.get(write.userId!) ?? []
    const acked = write.acked
      ? `acknowledged ${describeAttempt(write.acked, run.load.startedAt)} (${phase(run, write.acked.endedAt)}) as id ${write.ackedId}`
      : 'never acknowledged'
    if (found.length > 1) {
      failures.push(`subscription ${write.key} is stored ${found.length} times (ids ${found.map(row => row.id).join(', ')}); it was ${acked}`)
      continue
    }
    if (!write.acked) continue
    const [row] = found
    if (!row) failures.push(`subscription ${write.key} was ${acked}, but no such subscription is in Postgres: an acknowledged write was lost`)
    else if (row.id !== write.ackedId) failures.push(`subscription ${write.key} was ${acked}, but is stored as id ${row.id}`)
    else if (row.participantId !== run.pairs[write.pair]!.agent.id)
      failures.push(`subscription ${write.key} is stored for another agent: ${JSON.stringify(row)}`)
  }
  return failures
}

interface Metered {
  events: number
  counted: number
}

async function checkProxyCalls(run: ScenarioRun, sql: ReturnType<typeof createSql>): Promise<string[]> {
  // Calls the upstream received, by key (a key's call may reach it more than once).
  const received = new Map<string, number>()
  for (const body of run.upstreamBodies()) {
    const key = keyOf(body)
    if (key) received.set(key, (received.get(key) ?? 0) + 1)
  }
  const proxyWrites = run.load.writes.filter(write => write.kind === 'proxy')
  const expected = new Map(
    run.pairs.map(pair => [pair.subscriptionId, proxyWrites.filter(write => write.pair === pair.index && received.has(write.key))]),
  )

  const read = async () => {
    const events = await sql<{ id: string; n: number }[]>`select subscription_id as id, count(*)::int as n from usage_events group by 1`
    const counted = await sql<
      { id: string; n: number }[]
    >`select subscription_id as id, sum(proxy_calls)::int as n from subscription_periods group by 1`
    const metered = new Map<string, Metered>()
    for (const pair of run.pairs) {
      metered.set(pair.subscriptionId, {
        events: events.find(row => row.id === pair.subscriptionId)?.n ?? 0,
        counted: counted.find(row => row.id === pair.subscriptionId)?.n ?? 0,
      })
    }
    return metered
  }
  // Settled: every call that reached the upstream is metered (unacknowledged ones may wait for a retry
  // after the service's takeover time, beyond this wait, so they are not required; see below).
  const settled = (metered: Map<string, Metered>) =>
    [...expected].every(([id, writes]) => metered.get(id)!.events === writes.length && metered.get(id)!.counted === writes.length)
  const deadline = Date.now() + meteringWaitMs
  let metered = await read()
  while (!settled(metered) && Date.now() < deadline) {
    await Bun.sleep(250)
    metered = await read()
  }

  const failures: string[] = []
  for (const pair of run.pairs) {
    const writes = proxyWrites.filter(write => write.pair === pair.index)
    for (const write of writes) {
      if (write.acked && !received.has(write.key)) {
        failures.push(
          `proxy call ${write.key} was acknowledged ${describeAttempt(write.acked, run.load.startedAt)}, but the upstream never received it`,
        )
      }
    }
    const reached = expected.get(pair.subscriptionId)!
    const { events, counted } = metered.get(pair.subscriptionId)!
    const twice = reached.filter(write => received.get(write.key)! > 1).map(write => `${write.key} (${write.attempts.length} attempts)`)
    const retried = reached.filter(write => write.attempts.length > 1)
    const context =
      `${reached.length} keys reached the upstream (${reached.filter(write => write.acked).length} acknowledged)` +
      (twice.length ? `; the upstream got these keys more than once: ${twice.join(', ')}` : '') +
      (retried.length
        ? `; keys retried: ${retried
            .map(write => `${write.key} [${write.attempts.map(a => a.status ?? 'no answer').join(' ')}]`)
            .slice(0, 8)
            .join(', ')}`
        : '')
    const acknowledged = reached.filter(write => write.acked).length
    const waiting = reached.filter(write => !write.acked).map(write => write.key)
    const unacknowledged = waiting.length ? `; reached the upstream without an acknowledgement (metered or not): ${waiting.join(', ')}` : ''
    if (events < acknowledged) {
      failures.push(
        `subscription of pair ${pair.index}: ${events} usage events after ${meteringWaitMs} ms for ${acknowledged} acknowledged calls: ` +
          `at least ${acknowledged - events} acknowledged calls never metered; ${context}${unacknowledged}`,
      )
    } else if (events > reached.length) {
      failures.push(
        `subscription of pair ${pair.index}: ${events} usage events for ${reached.length} calls (keys) that reached the upstream, metered ${events - reached.length} extra; ${context}`,
      )
    }
    if (counted !== events) {
      failures.push(`subscription of pair ${pair.index}: subscription_periods.proxy_calls says ${counted}, usage_events holds ${events}`)
    }
  }
  return failures
}

function keyOf(body: string): string | undefined {
  try {
    return (JSON.parse(body) as { key?: string }).key
  } catch {
    return undefined
  }
}
