/**
 * Health for people and orchestrators: GET /health (can this process reach Postgres and Redis),
 * GET /health/live (the process answers) and GET /health/ready (it should be sent traffic).
 * GET /v1/health is /health in the `{success, data}` envelope, where the original service's CLIs
 * (`stamn status`, `openclaw stamn status`) look for it.
 */
import { Elysia, t } from 'elysia'
import type { Redis } from '../redis.ts'
import type { Lifecycle } from './lifecycle.ts'
import type { Sql } from '../db.ts'
import { errors, type ErrorDetail } from '../errors.ts'
import { failures, Ok, ok } from '../http/schema.ts'
import { lastApplied, readMigrations } from '../migrate.ts'

const Status = t.Union([t.Literal('ok'), t.Literal('down')])
const Health = t.Object(
  { status: t.Union([t.Literal('ok'), t.Literal('unavailable')]), postgres: Status, redis: Status },
  { $id: 'Health', description: 'Whether this process reaches PostgreSQL and Redis; 503 names what is down' },
)
const Live = t.Object({ status: t.Literal('live') }, { $id: 'Live', description: 'The process answers' })
const Ready = t.Object(
  { status: t.Literal('ready'), postgres: t.Literal('ok'), redis: t.Literal('ok'), migrations: t.Literal('applied') },
  { $id: 'Ready', description: 'The process should be sent traffic: PostgreSQL and Redis reachable, migrations applied, not draining' },
)

// Under a probe's usual timeout (Kubernetes: 1 s): a Postgres or Redis that hangs is answered as a
// 503 naming it, not a probe timing out on an answer that names nothing.
const checkMs = 750

const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('timeout')), ms))])

const reachable = (check: Promise<unknown>) =>
  within(check, checkMs).then(
    () => 'ok' as const,
    () => 'down' as const,
  )

/** How far the database's migrations are: `down` when Postgres cannot be asked. */
function migrationState(sql: Sql, expected: number): Promise<'applied' | 'pending' | 'down'> {
  return within(lastApplied(sql), checkMs).then(
    applied => (applied >= expected ? 'applied' : 'pending'),
    () => 'down',
  )
}

/** What the health routes check: the connections, and whether the process is draining. */
export interface RouteDeps {
  sql: Sql
  redis: Redis
  lifecycle: Lifecycle
}

export function healthRoutes({ sql, redis, lifecycle }: RouteDeps) {
  // The migrations this code needs; a database that has more (a newer version migrated it) will do.
  const expected = readMigrations().length
  const health = async () => {
    const [postgres, cache] = await Promise.all([reachable(sql`select 1`), reachable(redis.ping())])
    const healthy = postgres === 'ok' && cache === 'ok'
    return { status: healthy ? ('ok' as const) : ('unavailable' as const), postgres, redis: cache }
  }
  return new Elysia({ tags: ['operations'] })
    .get(
      '/health',
      async ({ set }) => {
        const answer = await health()
        if (answer.status !== 'ok') {
          set.status = 503
          // As on every other 503 (errors.ts): when to ask again.
          set.headers['retry-after'] = '1'
        }
        return answer
      },
      {
        response: { 200: Health, 503: Health },
        detail: {
          operationId: 'health',
          summary: 'Liveness of Postgres and Redis',
          description:
            'No credential. Each check has 0.75 s. A 503 says `status: unavailable` and names which is `down`. ' +
            'The body is not in the `{success, data}` envelope. Orchestrators use GET /health/live and GET /health/ready.',
          security: [],
        },
      },
    )
    .get(
      '/v1/health',
      async () => {
        const answer = await health()
        const details: ErrorDetail[] = []
        if (answer.postgres === 'down') details.push({ path: '/postgres', message: 'Postgres is unreachable' })
        if (answer.redis === 'down') details.push({ path: '/redis', message: 'Redis is unreachable' })
        if (details.length > 0) throw errors.backingDown(details)
        return ok(answer)
      },
      {
        response: { 200: Ok(Health), ...failures(503) },
        detail: {
          operationId: 'healthV1',
          summary: 'Liveness of Postgres and Redis, in the `{success, data}` envelope',
          description:
            'No credential. GET /health in the envelope, where the original service’s CLIs read `data.status`; ' +
            'when Postgres or Redis is down, 503 `unavailable` with a detail naming each.',
          security: [],
        },
      },
    )
    .get('/health/live', () => ok({ status: 'live' as const }), {
      response: { 200: Ok(Live) },
      detail: {
        operationId: 'healthLive',
        summary: 'The process answers (for a liveness probe: restart it when this fails)',
        description:
          'No credential. Reads neither PostgreSQL nor Redis, so their outages do not fail it. ' +
          'Whether to send the process traffic is GET /health/ready.',
        security: [],
      },
    })
    .get(
      '/health/ready',
      async () => {
        const [migrations, cache] = await Promise.all([migrationState(sql, expected), reachable(redis.ping())])
        const details: ErrorDetail[] = []
        if (migrations === 'down') details.push({ path: '/postgres', message: 'Postgres is unreachable' })
        if (migrations === 'pending') details.push({ path: '/migrations', message: 'Migrations are pending' })
        if (cache === 'down') details.push({ path: '/redis', message: 'Redis is unreachable' })
        if (lifecycle.draining) details.push({ path: '/draining', message: 'The process is shutting down' })
        if (details.length > 0) throw errors.notReady(details)
        return ok({ status: 'ready' as const, postgres: 'ok' as const, redis: 'ok' as const, migrations: 'applied' as const })
      },
      {
        response: { 200: Ok(Ready), ...failures(503) },
        detail: {
          operationId: 'healthReady',
          summary: 'Ready for traffic: Postgres and Redis reachable, migrations applied, not shutting down',
          description: 'No credential. For a load balancer: when one of these fails, 503 `unavailable` with a detail for each reason.',
          security: [],
        },
      },
    )
}
