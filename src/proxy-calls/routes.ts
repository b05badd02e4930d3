/** POST /v1/agent/proxy-call: an agent acts on a subscriber's connected account; every call that reaches the upstream is metered. */
import { createHash } from 'node:crypto'
import { Elysia } from 'elysia'
import type { Deps } from '../deps.ts'
import { newRowId } from '../ids.ts'
import { Ok, failure, failures, ok } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { proxyCall, reachedUpstream } from './proxy.ts'
import { ProxyCall, ProxyResult } from './schema.ts'

/** A stable UUID from a longer id, so a retried call is the same usage event. */
/** How long a proxy call's Idempotency-Key reservation lasts unless renewed (every third of it while the call runs). */
export const proxyCallLeaseMs = 10_000

function uuidFrom(id: string): string {
  const h = createHash('sha256').update(id).digest('hex')
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`
}

export function proxyCallRoutes(deps: Deps, auth: AuthPlugin) {
  return new Elysia({ tags: ['agent'] }).use(auth).post(
    '/v1/agent/proxy-call',
    async ({ agent, body, headers, set }) => {
      const request = {
        subject: principalSubject(agent),
        key: headers['idempotency-key'],
        method: 'POST',
        path: '/v1/agent/proxy-call',
        body,
      }
      // No transaction is held across the upstream call: the key is reserved, then completed.
      const outcome = await idempotentCommand(
        deps,
        request,
        async ({ commandId }) => ({
          status: 200,
          body: ok(await proxyCall(deps, agent, body, commandId ? uuidFrom(commandId) : newRowId())),
        }),
        // A repeat must not reach the upstream again: not while the first runs (409 in progress), nor
        // after it timed out there. The one exception is a reservation left by a process that died
        // mid-call: its lease, renewed while the call runs, lapses within 10 s and a repeat takes it
        // over. The upstream may then see the call twice, but it is metered once (same event id).
        { inFlight: 'refuse', keepFailure: error => reachedUpstream(error), leaseMs: proxyCallLeaseMs },
      )
      set.status = outcome.status
      return outcome.body as { success: true; data: typeof ProxyResult.static }
    },
    {
      agent: true,
      body: ProxyCall,
      headers: IdempotencyHeaders,
      response: {
        200: Ok(ProxyResult),
        ...failures(400, 401, 403, 404, 502, 503, 504),
        409: failure(
          'idempotency_key_reused: the Idempotency-Key was used with another body; idempotency_key_in_progress: the first call ' +
            'with this key is still running (or its process died less than 10 s ago), try again after the Retry-After header’s seconds',
        ),
      },
      detail: {
        operationId: 'proxyCall',
        summary:
          'Call a subscriber’s connected account with its stored credential (10 s limit, 1 MiB response cap); metered; honours Idempotency-Key',
      },
    },
  )
}
