/** Wire schemas of shared knowledge context entries. */
import { t } from 'elysia'
import { Int, Timestamp, Uuid } from '../http/schema.ts'

export const ContextTypeParam = t.Union(
  [
    t.Literal('brand'),
    t.Literal('audience'),
    t.Literal('tone'),
    t.Literal('products'),
    t.Literal('competitors'),
    t.Literal('keywords'),
    t.Literal('goals'),
    t.Literal('preferences'),
    t.Literal('team'),
    t.Literal('content_insights'),
    t.Literal('custom'),
  ],
  { description: 'One of the eleven context types' },
)
export type ContextType = typeof ContextTypeParam.static

export const ContextKey = t.String({ pattern: '^[A-Za-z0-9_.:-]{1,100}$', description: '1 to 100 of A-Z a-z 0-9 _ . : -' })
export const Confidence = t.Union([t.Literal('user_provided'), t.Literal('derived'), t.Literal('suggested')])

/** The `source.method` of a version the user wrote with their own credential; a revert's is `revert:v<N>`. */
export const userSourceMethod = 'user'
export const revertSourceMethod = (version: number) => `revert:v${version}`

export const ContextData = t.Object({}, { additionalProperties: true, description: 'A JSON object of at most 64 KiB' })
// An empty method is taken: the reference agent (a Python loop) sends `method: ""` when it has none to give.
export const Source = t.Object(
  { method: t.String({ maxLength: 200, description: 'How the value was obtained; may be empty' }) },
  { additionalProperties: true, description: 'At most 4 KiB' },
)

export const ContextEntry = t.Object(
  {
    type: ContextTypeParam,
    key: t.String(),
    data: ContextData,
    confidence: Confidence,
    version: Int({ minimum: 1 }),
    source: t.Union([Source, t.Null()]),
    author: t.Object({ kind: t.Union([t.Literal('agent'), t.Literal('user')]), id: Uuid }),
    createdAt: Timestamp,
  },
  {
    $id: 'ContextEntry',
    description: 'One version of a shared knowledge entry of an organization',
    examples: [
      {
        type: 'brand',
        key: 'voice',
        data: { tone: 'warm', avoid: ['jargon'] },
        confidence: 'derived',
        version: 3,
        source: { method: 'inferred from posts' },
        author: { kind: 'agent', id: '0b7c5a62-3f0e-4d7e-9a51-2c1d8e4f6a10' },
        createdAt: '2026-11-22T10:00:00.000Z',
      },
    ],
  },
)
export type ContextEntry = typeof ContextEntry.static

export const ContextEntries = t.Object({ entries: t.Array(ContextEntry) }, { $id: 'ContextEntries', description: 'Context entries' })

export const AgentWrite = t.Object(
  {
    userId: Uuid,
    type: ContextTypeParam,
    key: ContextKey,
    data: ContextData,
    confidence: t.Optional(Confidence),
    source: t.Optional(Source),
  },
  { $id: 'AgentContextWrite', description: 'A new version of an entry, written by an agent (derived or suggested)', additionalProperties: false },
)

export const UserWrite = t.Object(
  { data: ContextData },
  { $id: 'UserContextWrite', description: 'The entry’s new data, set by the user (user_provided)', additionalProperties: false },
)
export const Revert = t.Object(
  // Versions are Postgres integers: past them, the schema says so rather than the database.
  { version: Int({ minimum: 1, maximum: 2_147_483_647 }) },
  { $id: 'RevertContext', description: 'The version whose data and confidence become the newest', additionalProperties: false },
)
