/** Holding an actor from a test, as another process would: no command of it is applied meanwhile. */
import { randomUUID } from 'node:crypto'
import { createHolder } from '../../src/actors/hold.ts'
import type { Redis } from '../../src/redis.ts'
import type { Keys } from '../../src/keys.ts'

/** The function that lets go again, or null when someone else holds the actor. */
export async function holdActor(deps: { redis: Redis; keys: Keys }, actor: string, ms = 5000): Promise<(() => Promise<void>) | null> {
  const holder = createHolder(deps.redis, deps.keys, `test:${randomUUID()}`, ms)
  const [taken] = await holder.take([actor], -1)
  if (taken === 'busy' || taken instanceof Error) return null
  return async () => void (await holder.release(actor, []))
}
