/** Wire schemas of proxy calls. */
import { t } from 'elysia'
import { Int, Uuid } from '../http/schema.ts'

export const ProxyCall = t.Object(
  {
    userId: Uuid,
    provider: t.String({ pattern: '^[a-z0-9][a-z0-9_.-]{0,63}$' }),
    method: t.Union([t.Literal('GET'), t.Literal('POST'), t.Literal('PUT'), t.Literal('PATCH'), t.Literal('DELETE'), t.Literal('HEAD')]),
    path: t.String({ pattern: '^/', maxLength: 2048, description: 'Appended to the connection’s base URL' }),
    // Maps as objects with `additionalProperties` (not t.Record's `patternProperties`), which client
    // generators read as a map of that value type.
    query: t.Optional(t.Object({}, { additionalProperties: t.Union([t.String(), t.Number(), t.Boolean()]), maxProperties: 100 })),
    headers: t.Optional(
      t.Object(
        {},
        {
          // What a header field may hold (RFC 9110), less the obsolete bytes over 0x7f.
          additionalProperties: t.String({ maxLength: 4096, pattern: '^[\\t\\x20-\\x7e]*$' }),
          maxProperties: 50,
          description: 'At most 50: only content-type, accept and x-* headers, printable ASCII values',
        },
      ),
    ),
    body: t.Optional(t.Unknown({ description: 'A string is sent as is; anything else as JSON' })),
  },
  { $id: 'ProxyCall', description: 'A call on a subscriber’s connected account, made with its stored credential', additionalProperties: false },
)
export type ProxyCall = typeof ProxyCall.static

export const Usage = t.Object(
  {
    periodCalls: Int({ description: 'Calls in the current period, this one included' }),
    includedProxyCalls: Int(),
    overageCalls: Int(),
  },
  { $id: 'ProxyUsage', description: 'The subscription’s proxy calls in the current period' },
)

export const ProxyResult = t.Object(
  {
    status: Int({ description: 'The upstream’s status, not ours' }),
    headers: t.Object({ 'content-type': t.Union([t.String(), t.Null()]) }),
    body: t.Unknown(),
    usage: Usage,
  },
  { $id: 'ProxyResult', description: 'The upstream’s answer (its status, not ours) and the usage after the call' },
)
