/** The organization actor's commands: new versions of context entries, one at a time per organization. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import type { TxSql } from '../db.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { hasActiveSubscription } from '../billing/subscriptions/store.ts'
import { revertSourceMethod, type ContextEntry, type ContextType } from './schema.ts'
import { entryVersion, insertVersion, newestVersion, organizationOwner } from './store.ts'

export interface WriteEntry {
  type: ContextType
  key: string
  data: Record<string, unknown>
  confidence: ContextEntry['confidence']
  source: ContextEntry['source']
  author: ContextEntry['author']
}

export interface RevertEntry {
  type: ContextType
  key: string
  version: number
  userId: string
}

/** The new version, with the organization's user told of it in the same transaction. */
async function recorded(tx: TxSql, orgId: string, at: Date, entry: ContextEntry): Promise<ContextEntry> {
  const userId = await organizationOwner(tx, orgId)
  if (userId) {
    const payload = { type: entry.type, key: entry.key, version: entry.version, confidence: entry.confidence, author: entry.author }
    await enqueueEvents(tx, at, [{ userId, type: 'context.updated', payload }])
  }
  return entry
}

export function contextCommands(): ActorKind {
  return {
    'context.write': {
      async apply(tx, write: WriteEntry, { id: orgId, at }): Promise<ContextEntry | Refusal> {
        const newest = await newestVersion(tx, orgId, write)
        if (write.author.kind === 'agent') {
          // Checked here too, not only by the route: a cancellation that lands first ends access.
          const owner = await organizationOwner(tx, orgId)
          if (!owner || !(await hasActiveSubscription(tx, owner, write.author.id))) return { refused: 'not_subscribed' }
          if (newest?.confidence === 'user_provided') return { refused: 'user_provided_precedence' }
        }
        return recorded(tx, orgId, at, await insertVersion(tx, orgId, { ...write, version: (newest?.version ?? 0) + 1, at }))
      },
    },
    'context.revert': {
      async apply(tx, revert: RevertEntry, { id: orgId, at }): Promise<ContextEntry | Refusal> {
        const target = await entryVersion(tx, orgId, revert)
        if (!target) return { refused: 'not_found' }
        const newest = (await newestVersion(tx, orgId, revert))!
        const entry = await insertVersion(tx, orgId, {
          type: revert.type,
          key: revert.key,
          data: target.data,
          confidence: target.confidence,
          source: { method: revertSourceMethod(revert.version) },
          version: newest.version + 1,
          author: { kind: 'user', id: revert.userId },
          at,
        })
        return recorded(tx, orgId, at, entry)
      },
    },
  }
}
