/** /v1/agent/context: agents read and extend a subscriber's shared knowledge (documented with the context). */
import { Elysia, t } from 'elysia'
import type { Log } from '../log.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { EntryDeps } from '../context/entries.ts'
import { failures, Ok, ok, Query, Uuid } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { principalSubject } from '../auth/principal.ts'
import { IdempotencyHeaders, idempotentCommand } from '../idempotency/idempotent.ts'
import { readEntriesAsAgent, writeEntryAsAgent } from '../context/entries.ts'
import { AgentWrite, ContextEntries, ContextEntry, ContextKey, ContextTypeParam } from '../context/schema.ts'

export function agentContextRoutes(deps: EntryDeps & { rateLimiter: RateLimiter; log: Log }, auth: AuthPlugin) {
  return new Elysia({ prefix: '/v1/agent', tags: ['context'] })
    .use(auth)
    .get('/context', async ({ agent, query }) => ok({ entries: await readEntriesAsAgent(deps, agent.participantId, query) }), {
      agent: true,
      query: Query({ userId: Uuid, type: t.Optional(ContextTypeParam), key: t.Optional(ContextKey) }),
      response: { 200: Ok(ContextEntries), ...failures(400, 401, 403) },
      detail: {
        operationId: 'readContextAsAgent',
        summary: 'The newest version of each matching entry of a subscriber’s organization, by type then key',
        description:
          'Needs the agent’s key, and the user named by `userId` must hold an active subscription to the agent (else 403 ' +
          '`not_subscribed`). `type` (an unknown one is 400) and `key` narrow the list. ' +
          'Entries written by the user and by any agent are shown; before the first write there are none.',
      },
    })
    .post(
      '/context',
      async ({ agent, body, headers, set }) => {
        const request = { subject: principalSubject(agent), key: headers['idempotency-key'], method: 'POST', path: '/v1/agent/context', body }
        const outcome = await idempotentCommand(deps, request, async identity => {
          await deps.rateLimiter.take('contextWrite', principalSubject(agent))
          return { status: 201, body: ok(await writeEntryAsAgent(deps, agent.participantId, body, identity)) }
        })
        set.status = outcome.status
        return outcome.body as { success: true; data: typeof ContextEntry.static }
      },
      {
        agent: true,
        body: AgentWrite,
        headers: IdempotencyHeaders,
        response: { 201: Ok(ContextEntry), ...failures(400, 401, 403, 409, 429, 503) },
        detail: {
          operationId: 'writeContextAsAgent',
          summary: 'A new version of an entry (derived or suggested); 409 while the user’s own value stands (honours Idempotency-Key)',
          description:
            'Needs the agent’s key and the user’s active subscription (403 `not_subscribed`). ' +
            '`confidence` defaults to `suggested`. `user_provided`, or a `source.method` claiming the user’s word, is 403 ' +
            '`confidence_not_allowed`. `data` is a JSON object of at most 64 KiB. Versions count 1, 2, 3, ...; ' +
            'nothing is overwritten. Rate limited per agent (rule `contextWrite`): 429.',
        },
      },
    )
}
