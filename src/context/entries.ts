/** Reading and writing an organization's entries: the size limits, the organization's actor, and what a subscribed agent may do. */
import type { Sql } from '../db.ts'
import type { Clock } from '../clock.ts'
import type { Dispatcher } from '../actors/dispatcher.ts'
import { errors } from '../errors.ts'
import { accepted } from '../actors/refusal.ts'
import type { Refusal } from '../actors/types.ts'
import { hasActiveSubscription } from '../billing/subscriptions/store.ts'
import type { CommandIdentity } from '../idempotency/idempotent.ts'
import type { WriteEntry } from './commands.ts'
import { userSourceMethod, type AgentWrite, type ContextEntry, type ContextType } from './schema.ts'
import { ensureOrganization, findOrganization, newestEntries } from './store.ts'

const maxDataBytes = 64 * 1024
const maxSourceBytes = 4 * 1024

/** What reading and writing entries use. */
export interface EntryDeps {
  sql: Sql
  clock: Clock
  dispatcher: Dispatcher
}

export function checkSizes(data: unknown, source?: unknown) {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) throw errors.field('/data', 'must be a JSON object')
  if (storedBytes(data) > maxDataBytes) throw errors.field('/data', 'must be at most 64 KiB')
  if (source !== undefined && storedBytes(source) > maxSourceBytes) throw errors.field('/source', 'must be at most 4 KiB')
}

/**
 * The size of a JSON value as Postgres stores it: its numbers written out in full, as jsonb keeps
 * them (`1e300` is 301 digits there, 5 characters in JSON). Bodies nest at most 64 deep.
 */
function storedBytes(value: unknown): number {
  let bytes = Buffer.byteLength(JSON.stringify(value))
  const stack = [value]
  while (stack.length > 0) {
    const item = stack.pop()
    if (typeof item === 'number') bytes += fullLength(item) - JSON.stringify(item).length
    else if (item !== null && typeof item === 'object') for (const child of Object.values(item)) stack.push(child)
  }
  return bytes
}

/** The length of a finite number written with no exponent (`1.5e-7` is `0.00000015`). */
function fullLength(n: number): number {
  const short = String(Math.abs(n))
  const sign = n < 0 ? 1 : 0
  const e = short.indexOf('e')
  if (e === -1) return sign + short.length
  const mantissa = short.slice(0, e)
  const exponent = Number(short.slice(e + 1))
  const dot = mantissa.indexOf('.')
  const digits = dot === -1 ? mantissa.length : mantissa.length - 1
  const point = (dot === -1 ? mantissa.length : dot) + exponent
  if (point >= digits) return sign + point
  if (point <= 0) return sign + 2 - point + digits
  return sign + digits + 1
}

/**
 * A new version of an entry of the user's organization (made on first write), through its actor;
 * `identity` (an Idempotency-Key's) makes a repeat the same command, applied once.
 */
export async function writeEntry(
  { sql, dispatcher, clock }: EntryDeps,
  userId: string,
  command: WriteEntry,
  identity: CommandIdentity = {},
): Promise<ContextEntry> {
  const orgId = await ensureOrganization(sql, userId, clock.now())
  return accepted(await dispatcher.ask<ContextEntry | Refusal>(`org:${orgId}`, 'context.write', command, identity))
}

/** The newest version of each matching entry of a subscriber's organization, for an agent it subscribes to. */
export async function readEntriesAsAgent(
  { sql }: EntryDeps,
  agentId: string,
  filter: { userId: string; type?: ContextType; key?: string },
): Promise<ContextEntry[]> {
  if (!(await hasActiveSubscription(sql, filter.userId, agentId))) throw errors.notSubscribed()
  const orgId = await findOrganization(sql, filter.userId)
  return orgId ? await newestEntries(sql, orgId, { type: filter.type, key: filter.key }) : []
}

/**
 * Whether a source method is one only the user's own credential writes (`user`, `revert:v<N>`), or
 * `user_provided`, read regardless of case, width, spaces and punctuation: `USER`, ` user `,
 * `Revert: V2`, and of what is shown as nothing, letters included (the Hangul fillers: `user\u3164`).
 * Any other description of how a value was obtained is the agent's to give.
 */
export function claimsUserProvenance(method: string): boolean {
  const folded = method
    .normalize('NFKC')
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]|\p{Default_Ignorable_Code_Point}/gu, '')
  return folded === userSourceMethod || folded === 'userprovided' || /^revertv[0-9]+$/.test(folded)
}

/** An agent's version of a subscriber's entry (derived, or suggested by default; never user_provided, nor the user's provenance). */
export async function writeEntryAsAgent(
  deps: EntryDeps,
  agentId: string,
  body: typeof AgentWrite.static,
  identity: CommandIdentity = {},
): Promise<ContextEntry> {
  checkSizes(body.data, body.source)
  if (body.confidence === 'user_provided') throw errors.confidenceNotAllowed()
  if (body.source && claimsUserProvenance(body.source.method)) throw errors.userProvenanceNotAllowed()
  if (!(await hasActiveSubscription(deps.sql, body.userId, agentId))) throw errors.notSubscribed()
  return writeEntry(
    deps,
    body.userId,
    {
      type: body.type,
      key: body.key,
      data: body.data,
      confidence: body.confidence ?? 'suggested',
      source: body.source ?? null,
      author: { kind: 'agent', id: agentId },
    },
    identity,
  )
}
