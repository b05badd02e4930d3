/** GET /health: whether this process can reach Postgres and Redis right now. */
import { Elysia, t } from 'elysia'
import type { Deps } from '../deps.ts'

const Status = t.Union([t.Literal('ok'), t.Literal('down')])
const Health = t.Object(
  { status: t.Union([t.Literal('ok'), t.Literal('unavailable')]), postgres: Status, redis: Status },
  { $id: 'Health', description: 'Whether this process reaches PostgreSQL and Redis; 503 names what is down' },
)

const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('timeout')), ms))])

export function healthRoutes({ sql, redis }: Deps) {
  return new Elysia({ tags: ['operations'] }).get(
    '/health',
    async ({ set }) => {
      const [postgres, cache] = await Promise.all([
        within(sql`select 1`, 2000).then(
          () => 'ok' as const,
          () => 'down' as const,
        ),
        within(redis.ping(), 2000).then(
          () => 'ok' as const,
          () => 'down' as const,
        ),
      ])
      const healthy = postgres === 'ok' && cache === 'ok'
      if (!healthy) set.status = 503
      return { status: healthy ? ('ok' as const) : ('unavailable' as const), postgres, redis: cache }
    },
    {
      response: { 200: Health, 503: Health },
      detail: { operationId: 'health', summary: 'Liveness of Postgres and Redis', security: [] },
    },
  )
}
