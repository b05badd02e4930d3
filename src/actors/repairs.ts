/**
 * Projections given up, made good: a command applied in Postgres whose projection never reached Redis
 * (the lease lost, or the process closing, while Redis refused it; or a mailed command dead-lettered
 * after its projection kept failing) leaves the actor's Redis state stale. Its handler's `repair`
 * marks that state for a rebuild from Postgres; Redis is likely away when that is needed, so repairs
 * are tried again in the background until they land, one per actor and repair however many commands
 * asked for it.
 */
import { errorFields, type Log } from '../log.ts'
import type { CommandContext, CommandHandler } from './types.ts'

type Repair = NonNullable<CommandHandler['repair']>

export interface Repairs {
  /** Repairs what this command's projection would have changed, now and again until it lands. */
  add(handler: CommandHandler | undefined, context: CommandContext): void
  /** Tries once more what has not landed, and says in the log what is left stale. */
  close(): Promise<void>
}

export function createRepairs(log: Log, options: { firstDelayMs?: number; maxDelayMs?: number } = {}): Repairs {
  const firstDelayMs = options.firstDelayMs ?? 200
  const maxDelayMs = options.maxDelayMs ?? 5000
  /** By actor: each repair due, with the context of a command that asked for it. */
  const due = new Map<string, Map<Repair, CommandContext>>()
  let timer: ReturnType<typeof setTimeout> | undefined
  let running: Promise<void> | undefined
  let delay = 0
  let closed = false

  const attempt = async () => {
    for (const [actor, repairs] of [...due]) {
      for (const [repair, context] of [...repairs]) {
        try {
          await repair(context)
          // Asked for again meanwhile (another command given up): that request stays, to be tried again.
          if (repairs.get(repair) === context) repairs.delete(repair)
        } catch (error) {
          log.warn('actor repair failed; retrying', { actor, ...errorFields(error) })
        }
      }
      if (repairs.size === 0) due.delete(actor)
    }
  }

  const schedule = () => {
    if (closed || timer || running || due.size === 0) return
    timer = setTimeout(() => {
      timer = undefined
      running = attempt().finally(() => {
        running = undefined
        delay = due.size === 0 ? 0 : delay === 0 ? firstDelayMs : Math.min(delay * 2, maxDelayMs)
        schedule()
      })
    }, delay)
    // Retrying in the background keeps no process alive; close() makes the last attempt.
    timer.unref?.()
  }

  return {
    add(handler, context) {
      if (!handler?.repair) return
      if (closed) {
        log.error('actor repair asked for after shutdown; that actor’s Redis state is stale until rebuilt', { actor: context.actor })
        return
      }
      let repairs = due.get(context.actor)
      if (!repairs) due.set(context.actor, (repairs = new Map()))
      repairs.set(handler.repair, context)
      schedule()
    },
    async close() {
      closed = true
      clearTimeout(timer)
      timer = undefined
      await running
      if (due.size > 0) await attempt()
      if (due.size > 0) log.error('actor repairs given up at shutdown; those actors’ Redis state is stale until rebuilt', { actors: [...due.keys()] })
    },
  }
}
