/** The actor runtime with every kind this service has (`actorKinds` in src/deps.ts). */
import { actorKinds, type Deps } from '../src/deps.ts'
import { startActorRuntime, type ActorRuntime, type ActorRuntimeOptions } from '../src/actors/runtime.ts'
import { closeRedis } from '../src/redis.ts'

export function startActors(
  deps: Deps,
  options: Partial<Pick<ActorRuntimeOptions, 'leaseMs' | 'batchActors' | 'beforeAck'>> = {},
): Promise<ActorRuntime> {
  const { sql, keys, clock, log } = deps
  // A batch's leases, projections, replies and acknowledgements are issued together; on their own
  // connection with auto-pipelining they leave in a few writes instead of one write per command.
  const redis = deps.redis.duplicate({ enableAutoPipelining: true, connectionName: 'agent-marketplace:actors' })
  deps.metrics.watchRedis(redis)
  const onDeadLetter = (type: string) => deps.metrics.deadLettered(type)
  const runtime = startActorRuntime({ sql, redis, keys, clock, log, kinds: actorKinds({ ...deps, redis }), onDeadLetter, ...options })
  return runtime.then(
    started => ({
      id: started.id,
      stats: started.stats,
      async stop() {
        await started.stop()
        await closeRedis(redis)
      },
      abandon() {
        started.abandon()
        redis.disconnect()
      },
    }),
    async error => {
      redis.disconnect()
      throw error
    },
  )
}
