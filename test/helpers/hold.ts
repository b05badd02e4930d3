/** Holding an actor from a test, as another process would: no command of it is applied meanwhile. */
import { randomUUID } from 'node:crypto'
import { createHolder, isHold } from '../../src/actors/hold.ts'
import { createDue } from '../../src/actors/due.ts'
import type { Redis } from '../../src/redis.ts'
import type { Keys } from '../../src/keys.ts'

/** The function that lets go again (mail left meanwhile is then due at once, as any holder leaves it), or null when someone else holds the actor. */
export async function holdActor(deps: { redis: Redis; keys: Keys }, actor: string, ms = 5000): Promise<(() => Promise<void>) | null> {
  const holder = createHolder(deps.redis, deps.keys, `test:${randomUUID()}`, ms)
  const [taken] = await holder.take([{ actor, mail: 0 }])
  if (!isHold(taken!)) return null
  return async () => {
    if ((await holder.release(actor, [])) > 0) await createDue(deps.redis, deps.keys).mark(actor)
  }
}
