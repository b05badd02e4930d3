/** `bun run actors:dead-letters [--send-again] [--type T]`: lists the actors' dead letters, or sends them to their actors again. */
import { loadConfig } from '../config.ts'
import { connectRedis, closeRedis, createRedis } from '../redis.ts'
import { createKeys } from '../keys.ts'
import { createLog } from '../log.ts'
import { readDeadLetters, sendAgain, type DeadLetter } from '../actors/dead-letters.ts'
import { appliedCommandsKeptMs } from '../actors/store.ts'
import { runCli } from './run.ts'

const usage =
  'usage: npm run actors:dead-letters -- [--send-again] [--type <command type>] (needs REDIS_URL and REDIS_PREFIX as the service has them; ' +
  'lists the commands moved to dead-letter streams, with their errors; --send-again, once the cause is fixed, sends each to its actor again, which applies it at most once)'

// One line per letter up to this many; the count covers them all.
const shownAtMost = 50

await runCli('actors:dead-letters', usage, { 'send-again': { type: 'boolean' }, type: { type: 'string' } }, async values => {
  const config = loadConfig(process.env)
  const redis = createRedis(config.redisUrl, createLog('warn'), 'commands', 'dead-letters')
  await connectRedis(redis, config.redisUrl)
  try {
    const keys = createKeys(config.redisPrefix)
    const letters = (await readDeadLetters(redis, keys)).filter(letter => values.type === undefined || letter.type === values.type)
    for (const letter of letters.slice(0, shownAtMost)) console.log(describe(letter))
    if (letters.length > shownAtMost) console.log(`... and ${letters.length - shownAtMost} more`)
    if (!values['send-again']) {
      console.log(`actors:dead-letters: ${letters.length} dead letter${letters.length === 1 ? '' : 's'}`)
      return
    }
    for (const letter of letters) await sendAgain(redis, keys, letter)
    console.log(`actors:dead-letters: sent ${letters.length} again`)
    // Past the two days applied commands are remembered, a sender's retry since may have applied one.
    const old = letters.filter(letter => Date.now() - letter.movedAt.getTime() > appliedCommandsKeptMs).length
    if (old > 0) {
      console.error(
        `actors:dead-letters: ${old} of them moved over two days ago, past the time their command ids are remembered: ` +
          'one its sender sent again since (under the same Idempotency-Key) may be applied twice',
      )
    }
  } finally {
    await closeRedis(redis)
  }
})

function describe({ actor, type, movedAt, error }: DeadLetter): string {
  return `${movedAt.toISOString()} ${actor} ${type}: ${error}`
}
