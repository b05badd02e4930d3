/** POST /v1/agent/proxy-call: an agent acts on a subscriber's connected account; every call that reaches the upstream is metered. */
import { Elysia } from 'elysia'
import type { ProxyDeps } from '../proxy-calls/proxy.ts'
import { Ok, failure, failures, ok } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { proxyCall, proxyCallIdempotency, usageEventId } from '../proxy-calls/proxy.ts'
import { ProxyCall, ProxyResult } from '../proxy-calls/schema.ts'

export function proxyCallRoutes(deps: ProxyDeps, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['agent'] }).use(auth).post(
    '/proxy-call',
    async ({ agent, body, headers, set }) => {
      const request = {
        subject: principalSubject(agent),
        key: headers['idempotency-key'],
        method: 'POST',
        path: '/v1/agent/proxy-call',
        body,
      }
      const outcome = await idempotentCommand(
        deps,
        request,
        async identity => ({ status: 200, body: ok(await proxyCall(deps, agent, body, usageEventId(identity))) }),
        proxyCallIdempotency,
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
        ...failures(400, 401, 403, 404, 502, 504),
        429: failure(
          'rate_limited: over the agent’s proxyCall rate, or as many of its calls in flight as it may have (PROXY_IN_FLIGHT_PER_AGENT); see Retry-After',
        ),
        503: failure(
          'unavailable: a backing service is away, or this server holds as many upstream answers as it may (PROXY_BUFFER_BYTES; with ' +
            'Retry-After): the upstream was not called and nothing was metered',
        ),
        409: failure(
          'idempotency_key_reused: the Idempotency-Key was used with another body; idempotency_key_in_progress: the first call ' +
            'with this key is still running (or its process died less than 10 s ago), try again after the Retry-After header’s seconds',
        ),
      },
      detail: {
        operationId: 'proxyCall',
        summary:
          'Call a subscriber’s connected account with its stored credential (10 s limit, 1 MiB response cap); metered; honours Idempotency-Key',
        description:
          'Needs the agent’s key and the user’s active subscription (403 `not_subscribed`); ' +
          'no connection for `provider` is 404 `connection_not_found`. The upstream’s status is `data.status`, not ours. ' +
          'A call that reaches the upstream is metered, a timeout too. On 503, retry with the same `Idempotency-Key`: the ' +
          'call is metered once.',
      },
    },
  )
}
