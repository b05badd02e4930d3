/**
 * How runtimes learn which actors have mail: hints on one shared stream read through a consumer group
 * (each hint to one runtime); hints a dead runtime read and never finished, taken over once they have
 * sat long enough; and a sweep of the mailboxes for mail whose hint Redis lost.
 */
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { errorFields, type Log } from '../log.ts'
import { toRecord } from './hold.ts'

const hintGroup = 'runtimes'
// Hints are trimmed only past this backlog; a mailbox whose hint was trimmed is found by the sweep.
const readyMaxLength = 1_000_000

type Entry = [id: string, fields: string[] | null]

/** Tells the runtimes that the actor has mail. */
export async function hintRuntimes(redis: Redis, keys: Keys, actor: string): Promise<void> {
  await redis.xadd(keys.actorsReady, 'MAXLEN', '~', readyMaxLength, '*', 'actor', actor)
}

/** Marks hints as handled: their actors' mail is finished or handed on. */
export async function acknowledgeHints(redis: Redis, keys: Keys, ids: string[]): Promise<void> {
  if (ids.length > 0) await redis.xack(keys.actorsReady, hintGroup, ...ids)
}

export interface HintIntakeOptions {
  redis: Redis
  keys: Keys
  log: Log
  /** The runtime's id: its consumer name in the group. */
  id: string
  claimIdleMs: number
  sweepEveryMs: number
  /** Hints read at most per read. */
  room: number
  /** An actor has mail; `hintId` is the hint to acknowledge once it is handled (null: none). */
  hint(actor: string, hintId: string | null): void
}

/** Starts reading hints; `stop` ends every loop. */
export async function startHintIntake(options: HintIntakeOptions): Promise<{ stop(): Promise<void> }> {
  const { redis, keys, log, id } = options
  let running = true
  const blocking = redis.duplicate({ enableAutoPipelining: false, connectionName: 'agent-marketplace:actors-blocking' })
  const ensureGroup = () =>
    redis.xgroup('CREATE', keys.actorsReady, hintGroup, '0', 'MKSTREAM').catch(error => {
      if (!(error instanceof Error) || !error.message.startsWith('BUSYGROUP')) throw error
    })
  await ensureGroup()
  const take = (entries: Entry[]) => {
    for (const [hintId, fields] of entries) {
      const actor = fields ? toRecord(fields).actor : undefined
      if (actor) options.hint(actor, hintId)
      else void redis.xack(keys.actorsReady, hintGroup, hintId).catch(() => {})
    }
  }

  const readLoop = async () => {
    while (running) {
      try {
        const result = (await blocking.xreadgroup('GROUP', hintGroup, id, 'COUNT', options.room, 'BLOCK', 1000, 'STREAMS', keys.actorsReady, '>')) as
          [string, Entry[]][] | null
        take(result?.[0]?.[1] ?? [])
      } catch (error) {
        if (!running) return
        // Redis lost the stream or its group (a restart, a failover): make it again and go on.
        if (error instanceof Error && error.message.startsWith('NOGROUP')) await ensureGroup().catch(() => {})
        else log.warn('actor hint read failed', errorFields(error))
        await Bun.sleep(250)
      }
    }
  }

  let claimCursor = '0-0'
  const claimTimer = setInterval(
    async () => {
      try {
        const [next, entries] = (await redis.xautoclaim(keys.actorsReady, hintGroup, id, options.claimIdleMs, claimCursor, 'COUNT', 256)) as [
          string,
          Entry[],
        ]
        claimCursor = next
        take(entries)
      } catch (error) {
        if (running) log.warn('actor hint claim failed', errorFields(error))
      }
    },
    Math.max(250, Math.floor(options.claimIdleMs / 3)),
  )

  const sweepTimer = setInterval(async () => {
    try {
      let cursor = '0'
      do {
        const [next, found] = await redis.scan(cursor, 'MATCH', keys.mailboxPattern, 'COUNT', 1000)
        cursor = next
        for (const mailbox of found) {
          if ((await redis.xlen(mailbox)) > 0) options.hint(mailbox.slice(mailbox.indexOf('{actor:') + 7, mailbox.lastIndexOf('}')), null)
        }
      } while (cursor !== '0' && running)
    } catch (error) {
      if (running) log.warn('actor mailbox sweep failed', errorFields(error))
    }
  }, options.sweepEveryMs)

  const reading = readLoop()
  return {
    async stop() {
      running = false
      clearInterval(claimTimer)
      clearInterval(sweepTimer)
      blocking.disconnect()
      await reading
    },
  }
}
