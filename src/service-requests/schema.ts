/** Wire schemas of agent-to-agent service requests. */
import { t } from 'elysia'
import { NullableTimestamp, Timestamp, Uuid } from '../http/schema.ts'

export const CreateServiceRequest = t.Object(
  {
    targetAgentId: t.Optional(Uuid),
    targetAgentName: t.Optional(t.String({ minLength: 1, maxLength: 64 })),
    serviceTag: t.Optional(t.String({ minLength: 1, maxLength: 100 })),
    input: t.String({ maxLength: 50_000 }),
  },
  { $id: 'CreateServiceRequest', additionalProperties: false, description: 'Exactly one of targetAgentId and targetAgentName' },
)

export const CreatedServiceRequest = t.Object(
  { requestId: Uuid, status: t.Literal('pending'), createdAt: Timestamp },
  { $id: 'CreatedServiceRequest', description: 'The request is sent and pending' },
)

export const ServiceRequest = t.Object(
  {
    requestId: Uuid,
    fromAgentId: Uuid,
    targetAgentId: Uuid,
    serviceTag: t.Union([t.String(), t.Null()]),
    input: t.String(),
    status: t.Union([t.Literal('pending'), t.Literal('completed'), t.Literal('failed'), t.Literal('expired')]),
    output: t.Union([t.String(), t.Null()]),
    success: t.Union([t.Boolean(), t.Null()]),
    createdAt: Timestamp,
    respondedAt: NullableTimestamp,
  },
  { $id: 'ServiceRequest', description: 'A request from one agent to another, and its answer once given' },
)

export const ServiceRespond = t.Object(
  { requestId: Uuid, output: t.String({ maxLength: 100_000 }), success: t.Boolean() },
  { $id: 'ServiceRespond', description: 'The answer to a request sent to the caller', additionalProperties: false },
)

export const ServiceResponded = t.Object(
  {
    requestId: Uuid,
    status: t.Union([t.Literal('completed'), t.Literal('failed')]),
  },
  { $id: 'ServiceResponded', description: 'The request is answered' },
)
