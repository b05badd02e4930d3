/** The organization actor's commands: new versions of context entries, one at a time per organization. */
import type { ActorKind, Refusal } from '../actors/types.ts'
import type { TxSql } from '../db.ts'
import { enqueueEvents } from '../events/outbox.ts'
import { hasActiveSubscription } from '../billing/subscriptions/store.ts'
import { revertSourceMethod, type ContextEntry, type ContextType } from './schema.ts'
import { entryVersion, insertVersion, newestVersion, organizationOwner, type NewVersion } from './store.ts'

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

/**
 * The new version, with the organization's user (`userId`) told of it in the same transaction: the
 * event needs nothing the insert answers, so both go together, one round trip.
 */
async function recorded(tx: TxSql, orgId: string, userId: string | undefined, version: NewVersion): Promise<ContextEntry> {
  const payload = { entryType: version.type, key: version.key, version: version.version, confidence: version.confidence, author: version.author }
  const [entry] = await Promise.all([
    insertVersion(tx, orgId, version),
    userId && enqueueEvents(tx, version.at, [{ userId, type: 'context.updated', payload }]),
  ])
  return entry
}

export function contextCommands(): ActorKind {
  return {
    'context.write': {
      async apply(tx, write: WriteEntry, { id: orgId, at }): Promise<ContextEntry | Refusal> {
        const [newest, owner] = await Promise.all([newestVersion(tx, orgId, write), organizationOwner(tx, orgId)])
        if (write.author.kind === 'agent') {
          // Checked here too, not only by the route: a cancellation that lands first ends access.
          if (!owner || !(await hasActiveSubscription(tx, owner, write.author.id))) return { refused: 'not_subscribed' }
          if (newest?.confidence === 'user_provided') return { refused: 'user_provided_precedence' }
        }
        return recorded(tx, orgId, owner, { ...write, version: (newest?.version ?? 0) + 1, at })
      },
    },
    'context.revert': {
      async apply(tx, revert: RevertEntry, { id: orgId, at }): Promise<ContextEntry | Refusal> {
        const [target, newest, owner] = await Promise.all([
          entryVersion(tx, orgId, revert),
          newestVersion(tx, orgId, revert),
          organizationOwner(tx, orgId),
        ])
        if (!target) return { refused: 'not_found' }
        return recorded(tx, orgId, owner, {
          type: revert.type,
          key: revert.key,
          data: target.data,
          confidence: target.confidence,
          source: { method: revertSourceMethod(revert.version) },
          version: newest!.version + 1,
          author: { kind: 'user', id: revert.userId },
          at,
        })
      },
    },
  }
}
