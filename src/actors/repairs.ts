/**
 * Projections given up, made good: a command applied in Postgres whose projection never reached Redis
 * (the lease lost, or the process closing, while Redis refused it; or a mailed command dead-lettered
 * after its projection kept failing) leaves the actor's Redis state stale. Its handler's `repair`
 * marks that state for a rebuild from Postgres; Redis is likely away when that is needed, so repairs
 * are tried again in the background until they land, one per actor and repair however many commands
 * asked for it.
 */
import { errorFields, type Log } from '../log.ts'
import { createRetries } from '../retries.ts'
import type { CommandContext, CommandHandler } from './types.ts'

type Repair = NonNullable<CommandHandler['repair']>

export interface Repairs {
  /** Repairs what this command's projection would have changed, now and again until it lands. */
  add(handler: CommandHandler | undefined, context: CommandContext): void
  /** Tries once more what has not landed, and says in the log what is left stale. */
  close(): Promise<void>
}

export function createRepairs(log: Log, options: { firstDelayMs?: number; maxDelayMs?: number } = {}): Repairs {
  // One retry an actor and repair: the context of the latest command that asked for it.
  const repairIds = new WeakMap<Repair, number>()
  let lastId = 0
  const idOf = (repair: Repair) => {
    let id = repairIds.get(repair)
    if (id === undefined) repairIds.set(repair, (id = ++lastId))
    return id
  }
  const retries = createRetries<{ repair: Repair; context: CommandContext }>({
    attempt: ({ repair, context }) => repair(context),
    failed: (_key, { context }, error) => log.warn('actor repair failed; retrying', { actor: context.actor, ...errorFields(error) }),
    firstDelayMs: options.firstDelayMs,
    maxDelayMs: options.maxDelayMs,
  })

  return {
    add(handler, context) {
      if (!handler?.repair) return
      if (!retries.add(`${context.actor}\u0000${idOf(handler.repair)}`, { repair: handler.repair, context })) {
        log.error('actor repair asked for after shutdown; that actor’s Redis state is stale until rebuilt', { actor: context.actor })
      }
    },
    async close() {
      const left = await retries.close()
      if (left.size > 0) {
        const actors = [...new Set([...left.values()].map(({ context }) => context.actor))]
        log.error('actor repairs given up at shutdown; those actors’ Redis state is stale until rebuilt', { actors })
      }
    },
  }
}
