/**
 * Check: every acknowledged message reached the agent owner's stream as `conversation.message`, every
 * acknowledged reply the subscriber's as `conversation.reply` (found by the messageId in the event's
 * data), and every acknowledged subscription the owner's as `subscription.created` (by its subscriptionId), on streams that resume with Last-Event-ID whenever they are cut. A missing event is
 * looked up in the Redis stream, to tell "never published" from "published but not delivered".
 */
import { Redis } from 'ioredis'
import { countMessage } from './log-lines.ts'
import { describeAttempt } from './http-client.ts'
import type { WriteRecord } from './load-driver.ts'
import { at, phase, type ScenarioRun } from './scenario-run.ts'

/** How long events may take to arrive after the load stops (an outbox relays what waited). */
const deliveryWaitMs = 15_000

interface Expected {
  write: WriteRecord
  recipient: string
  recipientRole: 'owner' | 'subscriber'
  type: 'conversation.message' | 'conversation.reply' | 'subscription.created'
  /** The field of the event's data that carries the write's id. */
  idField: 'messageId' | 'subscriptionId'
}

export async function checkEvents(run: ScenarioRun): Promise<string[]> {
  const expected: Expected[] = []
  for (const write of run.load.writes) {
    if (!write.acked || write.kind === 'proxy') continue
    const pair = run.pairs[write.pair]!
    if (write.kind === 'message')
      expected.push({ write, recipient: pair.owner.id, recipientRole: 'owner', type: 'conversation.message', idField: 'messageId' })
    else if (write.kind === 'reply')
      expected.push({ write, recipient: pair.user.id, recipientRole: 'subscriber', type: 'conversation.reply', idField: 'messageId' })
    else expected.push({ write, recipient: pair.owner.id, recipientRole: 'owner', type: 'subscription.created', idField: 'subscriptionId' })
  }
  const delivered = (e: Expected) =>
    run.streams.get(e.recipient)!.events.some(event => event.type === e.type && event.data?.[e.idField] === e.write.ackedId)
  const deadline = Date.now() + deliveryWaitMs
  while (expected.some(e => !delivered(e)) && Date.now() < deadline) await Bun.sleep(100)
  const missing = expected.filter(e => !delivered(e))
  if (missing.length === 0) return []

  const redis = new Redis(run.servers.redis.url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  redis.on('error', () => {})
  try {
    await redis.connect()
    const kept = new Map<string, Map<string, string>>()
    const streamOf = async (userId: string) => {
      let found = kept.get(userId)
      if (!found) {
        found = new Map()
        const entries = (await redis.xrange(`${run.deployment.redisPrefix}events:user:${userId}`, '-', '+')) as [string, string[]][]
        for (const [id, fields] of entries) {
          const data = JSON.parse(fields[fields.indexOf('data') + 1]!) as { messageId?: string; subscriptionId?: string }
          const writeId = data.messageId ?? data.subscriptionId
          if (writeId) found.set(writeId, id)
        }
        kept.set(userId, found)
      }
      return found
    }
    const unpublished = run.deployment.all.map(service => `${service.name} ${countMessage(service, 'event not published')}`).join(', ')
    const failures: string[] = []
    for (const e of missing) {
      const stream = run.streams.get(e.recipient)!
      const inRedis = (await streamOf(e.recipient)).get(e.write.ackedId!)
      const cuts = stream.connections.length - 1
      const where = inRedis
        ? `it is in the Redis stream as ${inRedis}, but the open stream never delivered it (the stream was cut ${cuts} times and resumed; ` +
          `its connections: ${stream.connections
            .map(c => `api-${c.api + 1} ${at(run, c.openedAt)} from ${c.resumedFrom} → ${c.status ?? ''} ${c.error ?? 'open'}`)
            .slice(-4)
            .join('; ')})`
        : `it is not in the Redis stream either: never published ("event not published" logged: ${unpublished})`
      failures.push(
        `${e.write.kind} ${e.write.key} (id ${e.write.ackedId}), acknowledged ${describeAttempt(e.write.acked!, run.load.startedAt)} ` +
          `(${phase(run, e.write.acked!.endedAt)}): the ${e.recipientRole}'s stream got no ${e.type} within ${deliveryWaitMs} ms after the load; ${where}`,
      )
    }
    return [`${missing.length} of ${expected.length} events of acknowledged writes never reached their stream:`, ...failures]
  } finally {
    redis.disconnect()
  }
}
