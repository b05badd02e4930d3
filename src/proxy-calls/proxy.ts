/** A proxy call: check the subscription and connection, build the upstream request under the rules, forward, meter. */
import { createHash } from 'node:crypto'
import type { DatabaseIdentity, Sql } from '../db.ts'
import type { Redis } from '../redis.ts'
import type { Keys } from '../keys.ts'
import type { Clock } from '../clock.ts'
import type { Config } from '../config.ts'
import type { Queues } from '../queues.ts'
import type { RateLimiter } from '../rate-limit/token-bucket.ts'
import type { InFlightLimiter } from '../rate-limit/in-flight.ts'
import type { BufferBudget } from './buffer-budget.ts'
import { AppError, errors, inOrder } from '../errors.ts'
import { newRowId } from '../ids.ts'
import { throttled, type Log, type Throttled } from '../log.ts'
import type { CommandIdentity, CommandOptions } from '../idempotency/idempotent.ts'
import { principalSubject, type AgentPrincipal } from '../auth/principal.ts'
import { activeSubscription } from '../billing/subscriptions/store.ts'
import { findSealedConnection } from '../connections/store.ts'
import { connectionKeys, openCredential } from '../connections/credential-box.ts'
import { upstreamRefusal } from '../connections/address-policy.ts'
import { meterCall, type Usage } from '../metering/meter.ts'
import { forward, maxResponseBytes, UpstreamAnswerFailed, upstreamTimeoutMs } from './forward.ts'
import { checkProxyPath } from './path-policy.ts'
import type { ProxyCall } from './schema.ts'

/**
 * How a proxy call runs under an Idempotency-Key. No transaction is held across the upstream call:
 * the key is reserved, then completed. A repeat must not reach the upstream again: not while the first
 * runs (409 in progress), nor after it timed out there. The one exception is a reservation left by a
 * process that died mid-call: its lease (`commandLeaseMs`), renewed while the call runs, lapses within 10 s and a repeat
 * takes it over. The upstream may then see the call twice, but it is metered once (same event id).
 */
export const proxyCallIdempotency: CommandOptions = {
  keepFailure: error => reachedUpstream(error),
}

/** The call's usage event id: every repeat under one Idempotency-Key reservation is the same event. */
export function usageEventId({ commandId }: CommandIdentity): string {
  return commandId ? uuidFrom(commandId) : newRowId()
}

/** A stable UUID from a longer id, so a retried call is the same usage event. */
function uuidFrom(id: string): string {
  const h = createHash('sha256').update(id).digest('hex')
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-8${h.slice(17, 20)}-${h.slice(20, 32)}`
}

export interface ProxyResult {
  status: number
  headers: { 'content-type': string | null }
  body: unknown
  usage: Usage
}

/** How long a call's place among its agent's calls in flight outlives a process that died mid-call: past any call's end. */
export const inFlightLeaseMs = 3 * upstreamTimeoutMs

/** What a proxy call uses: its budgets, the upstream's connection, and the metering of the call. */
export interface ProxyDeps {
  sql: Sql
  redis: Redis
  keys: Keys
  database: DatabaseIdentity
  clock: Clock
  log: Log
  config: Config
  queues: Queues
  rateLimiter: RateLimiter
  inFlight: InFlightLimiter
  proxyBuffers: BufferBudget
}

/**
 * A proxy call within its agent's budgets: the `proxyCall` rate and `PROXY_IN_FLIGHT_PER_AGENT` calls
 * at once across processes (429 `rate_limited`), and this process's `PROXY_BUFFER_BYTES` (503).
 */
export async function proxyCall(deps: ProxyDeps, agent: AgentPrincipal, call: ProxyCall, eventId: string): Promise<ProxyResult> {
  checkProxyPath(call.path)
  const subject = principalSubject(agent)
  await deps.rateLimiter.take('proxyCall', subject)
  const exit = await deps.inFlight.enter({ name: 'proxyCall', max: deps.config.proxy.inFlightPerAgent, leaseMs: inFlightLeaseMs }, subject)
  try {
    return await callUpstream(deps, agent, call, eventId)
  } finally {
    await exit()
  }
}

async function callUpstream(deps: ProxyDeps, agent: AgentPrincipal, call: ProxyCall, eventId: string): Promise<ProxyResult> {
  const { sql, config, clock } = deps
  const [subscription, connection] = await inOrder([
    activeSubscription(sql, call.userId, agent.participantId),
    findSealedConnection(sql, call.userId, call.provider),
  ] as const)
  if (!subscription) throw errors.notSubscribed()
  if (!connection) throw errors.connectionNotFound()

  const url = upstreamUrl(connection.baseUrl, call.path, call.query)
  // Checked again at every call: what a name resolves to can change after the connection was made.
  const refusal = await upstreamRefusal(url, config.proxyAllowedHosts)
  if (refusal === 'unresolvable') throw errors.upstreamUnreachable()
  if (refusal) throw errors.upstreamRefused()

  const headers = allowedHeaders(call.headers ?? {})
  let body: string | undefined
  if (call.body !== undefined && call.method !== 'GET' && call.method !== 'HEAD') {
    body = typeof call.body === 'string' ? call.body : JSON.stringify(call.body)
    if (typeof call.body !== 'string' && !headers['content-type']) headers['content-type'] = 'application/json'
  }
  const opened = openCredential(connectionKeys(config), connection.credential, connection.id)
  if (!opened) {
    unreadableLog(deps.log)(
      'error',
      'credential-unreadable',
      'a connected account’s credential opens with neither CONNECTIONS_KEY nor CONNECTIONS_KEY_PREVIOUS; its proxy calls answer 503: ' +
        'set CONNECTIONS_KEY_PREVIOUS to the key that sealed it (then run `npm run connections:reseal`), or, that key lost, the user must delete and add the connection again',
      { connectionId: connection.id, userId: call.userId },
    )
    throw errors.credentialUnreadable()
  }
  headers.authorization = `Bearer ${opened.credential}`

  // The most a call may buffer is reserved before the upstream is asked, so a refusal (503) leaves
  // nothing done: no upstream reached, nothing metered; a retry under the Idempotency-Key runs it.
  const release = deps.proxyBuffers.reserve(maxResponseBytes)
  try {
    const occurredAt = clock.now()
    let response
    try {
      response = await forward({ url, method: call.method, headers, body })
    } catch (error) {
      // It reached the upstream, only the answer failed us: the call counts all the same.
      if (reachedUpstream(error)) await meterCall(deps, { eventId, subscription, occurredAt })
      throw error
    }
    const usage = await meterCall(deps, { eventId, subscription, occurredAt })
    return { status: response.status, headers: { 'content-type': response.contentType }, body: response.body, usage }
  } finally {
    release()
  }
}

// One record a minute per process for every credential no key opens (each call for one would write one).
const unreadableLogs = new WeakMap<Log, Throttled>()
function unreadableLog(log: Log): Throttled {
  let write = unreadableLogs.get(log)
  if (!write) unreadableLogs.set(log, (write = throttled(log, 60_000)))
  return write
}

/** Failures that came after the request was sent: the upstream has it. */
export function reachedUpstream(error: unknown): error is AppError {
  return (
    error instanceof UpstreamAnswerFailed || (error instanceof AppError && (error.code === 'upstream_timeout' || error.code === 'upstream_too_large'))
  )
}

/** The base URL with the path appended, and the base's query, then the call's; the path may not leave the base's origin or path. */
function upstreamUrl(base: string, path: string, query: ProxyCall['query']): URL {
  const baseUrl = new URL(base)
  const basePath = baseUrl.pathname.replace(/\/+$/, '')
  let url: URL
  try {
    url = new URL(basePath + path, baseUrl.origin)
  } catch {
    throw errors.field('/path', 'is not a valid path')
  }
  if (url.origin !== baseUrl.origin || !(url.pathname === basePath || url.pathname.startsWith(`${basePath}/`))) {
    throw errors.field('/path', 'must stay under the connection’s base URL')
  }
  // The base's own query (an API version, a tenant) comes first: the connection was made with it.
  if (baseUrl.search) url.search = baseUrl.search + url.search.replace(/^\?/, '&')
  for (const [name, value] of Object.entries(query ?? {})) url.searchParams.append(name, String(value))
  return url
}

function allowedHeaders(headers: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {}
  for (const [rawName, value] of Object.entries(headers)) {
    const name = rawName.toLowerCase()
    if (!(name === 'content-type' || name === 'accept' || /^x-[a-z0-9-]{1,100}$/.test(name))) {
      throw errors.field(`/headers/${rawName}`, 'only content-type, accept and x-* headers may be sent')
    }
    out[name] = value
  }
  return out
}
