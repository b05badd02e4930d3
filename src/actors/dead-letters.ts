/**
 * The actors' dead letters, for an operator: the commands careful.ts moved out of their mailboxes
 * after five failures that were not an outage (a bug, a constraint, a type this release has no
 * handler for), each with its error; and, once the cause is fixed, each sent to its actor again.
 */
import { defineScript, type Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import { createDue } from './due.ts'
import { mailboxEntry } from './dispatcher.ts'

export interface DeadLetter {
  /** Its dead-letter stream, and its id there. */
  stream: string
  id: string
  /** When it was moved there (its id's milliseconds). */
  movedAt: Date
  actor: string
  type: string
  error: string
  /** The mailbox entry's fields as its sender wrote them, with `entry` (its id in the mailbox) and `error`. */
  fields: Record<string, string>
}

// KEYS the dead-letter stream; ARGV the letter's id. Takes it out, and the stream with its last
// letter: XDEL leaves an empty stream behind, which stayed in Redis for good (and in every listing).
const takeOut = defineScript(`
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return 1`)

/** Every dead letter under the keys' prefix, oldest first within each actor. */
export async function readDeadLetters(redis: Redis, keys: Keys): Promise<DeadLetter[]> {
  const head = `${keys.prefix}{actor:`
  const tail = '}:dead'
  const streams = new Set<string>()
  let cursor = '0'
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${globEscaped(head)}*${tail}`, 'COUNT', 1000)
    for (const key of found) streams.add(key)
    cursor = next
  } while (cursor !== '0')
  const letters: DeadLetter[] = []
  for (const stream of [...streams].sort()) {
    const actor = stream.slice(head.length, -tail.length)
    for (const [id, list] of await redis.xrange(stream, '-', '+')) {
      const fields: Record<string, string> = {}
      for (let i = 0; i + 1 < list.length; i += 2) fields[list[i]!] = list[i + 1]!
      letters.push({ stream, id, movedAt: new Date(Number(id.split('-')[0])), actor, type: fields.type ?? '', error: fields.error ?? '', fields })
    }
  }
  return letters
}

/**
 * Sends the letter to its actor again, at the end of its mailbox, then takes it out of the stream.
 * It keeps its command id and is marked as one that may come again, so the actor applies it at most
 * once (within the two days applied commands are remembered), however often it is sent. No one
 * waits for its answer: its sender was answered 503 when it was moved.
 */
export async function sendAgain(redis: Redis, keys: Keys, letter: DeadLetter): Promise<void> {
  const { type, payload, command, hash, entry } = letter.fields
  const again = mailboxEntry({
    type: type ?? '',
    payload: payload ?? 'null',
    command: command || entry || '',
    repeatable: true,
    hash: hash ?? '',
    reply: '',
    ask: '',
  })
  await redis.xadd(keys.actor(letter.actor).mailbox, '*', ...again)
  await createDue(redis, keys).mark(letter.actor)
  await takeOut(redis, [letter.stream], [letter.id])
}

/** `text` matched literally by SCAN's glob. */
const globEscaped = (text: string) => text.replace(/[*?[\]\\]/g, '\\$&')
