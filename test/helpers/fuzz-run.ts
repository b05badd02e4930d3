/** The fuzzer's loop: each operation's valid request, then its mutations, every answer held to the oracle. */
import type { TestAgent, TestContext } from './context.ts'
import { stateDigest, type Answer, type documentOracle, type Operation } from './fuzz-oracle.ts'
import {
  bodyMutations,
  combined,
  concurrentMutations,
  headMutations,
  methodMutations,
  headerMutations,
  pathMutations,
  positiveMutation,
  queryMutations,
  strayBodyMutations,
  type Mutation,
} from './fuzz-mutations.ts'
import { onRoute, send, type Spec } from './fuzz-requests.ts'
import { doorProblems, requestProblems } from './fuzz-validity.ts'
import type { Random } from './seeded.ts'
import { asAgent, type World } from './fuzz-world.ts'

/** A valid request of an operation, but its method and path. */
export type Build = Omit<Spec, 'method' | 'path'>

export interface Run {
  ctx: TestContext
  oracle: ReturnType<typeof documentOracle>
  world: World
  cases: Record<string, () => Build | Promise<Build>>
  credentials: Mutation[]
  random: Random
  /** Random rounds per operation, past the fixed mutations. */
  iterations: number
  /** The share of refused writes whose effect is read back. */
  snapshotShare: number
  /** A listening server's origin, to send over the wire; in process without. */
  origin?: string
}

export interface Finding {
  operationId: string
  label: string
  problem: string
  seen: string
}

export interface Outcome {
  sent: number
  findings: Finding[]
  /** Requests the document calls valid that were refused as invalid: rules it does not state. */
  stricter: Set<string>
}

/**
 * Operations whose success uses up what it names: the next request needs a fresh one. A new agent's
 * or connection's name is taken by it (409 to the rest), and a target holds only a quarter of its open
 * requests from one sender (429 to the rest).
 */
const usedUp = [
  'pollDeviceAuthorization',
  'decideDeviceAuthorization',
  'respondToServiceRequest',
  'subscribe',
  'createParticipant',
  'createConnection',
  'createServiceRequest',
]

/** What one operation was sent: requests, and how many of them succeeded past its valid request (random ones apart). */
export interface Sent {
  sent: number
  succeeded: number
  /** Random valid bodies (alone or four at once) that succeeded, of those sent. */
  random: { sent: number; succeeded: number }
}

export async function fuzzAll(run: Run, each?: (operationId: string, sent: Sent) => void): Promise<Outcome> {
  const outcome: Outcome = { sent: 0, findings: [], stricter: new Set() }
  for (const op of run.oracle.operations) {
    const sent = await fuzzOperation(run, op, outcome)
    each?.(op.operationId, sent)
    outcome.sent += sent.sent
  }
  return outcome
}

async function fuzzOperation(run: Run, op: Operation, outcome: Outcome): Promise<Sent> {
  const build = async (): Promise<Spec> => ({ method: op.method, path: op.path, ...(await run.cases[op.operationId]!()) })
  const schema = op.requestBody?.content['application/json']?.schema
  const base = await build()
  const valid = await exercise(run, op, base, undefined, outcome)
  if (valid.status >= 300)
    outcome.findings.push({ operationId: op.operationId, label: 'valid', problem: 'the valid request failed', seen: String(valid.status) })
  const fixed = [
    ...bodyMutations(schema),
    ...strayBodyMutations(op),
    ...headMutations(op),
    ...methodMutations(op, run.oracle.operations),
    ...pathMutations(op),
    ...queryMutations(op),
    ...headerMutations(op, run.random),
    ...run.credentials,
  ]
  const rounds = [...fixed, ...concurrentMutations(op, run.random)]
  for (let i = 0; i < run.iterations; i++) rounds.push(positiveMutation(schema, run.random), combined(fixed, run.random))
  // A success used the resource up; a refusal left it as it was, for the next mutation.
  const usesUp = op.method === 'DELETE' || usedUp.includes(op.operationId)
  let current = base
  let spent = valid.status < 300
  const counts: Sent = { sent: 1, succeeded: 0, random: { sent: 0, succeeded: 0 } }
  for (const mutation of rounds) {
    const credential = mutation.where === 'credential'
    if (usesUp && spent && !credential) [current, spent] = [await build(), false]
    const requests = mutation.apply(credential ? base : current)
    const answers: Answer[] = []
    if (mutation.together) answers.push(...(await Promise.all(requests.map(request => exercise(run, op, request, mutation, outcome)))))
    else for (const request of requests) answers.push(await exercise(run, op, request, mutation, outcome))
    if (!credential) spent ||= answers.some(answer => answer.status < 300)
    const succeeded = answers.filter(answer => answer.status < 300).length
    counts.sent += requests.length
    counts.succeeded += succeeded
    if (mutation.label === 'random valid values' || mutation.label === 'four random valid bodies at once') {
      counts.random.sent += requests.length
      counts.random.succeeded += succeeded
    }
  }
  return counts
}

/** Sends one request and records every way its answer breaks the rule or the document. */
async function exercise(run: Run, op: Operation, request: Spec, mutation: Mutation | undefined, outcome: Outcome): Promise<Answer> {
  const label = mutation?.label ?? 'valid'
  // Of credentials, those every operation must refuse (one that is accepted may make its user, as a first token does).
  const credential = mutation?.where === 'credential' && !mutation.refused
  const sampled = mutation && !mutation.together && !credential && op.method !== 'GET' && run.random.chance(run.snapshotShare)
  const before = sampled ? await readBack(run) : undefined
  const answer = await send(run.ctx.app, request, run.origin)
  // Another method than the operation's (a HEAD is its GET's): no operation's, so only the rule holds.
  const otherMethod = request.method !== op.method && request.method !== 'HEAD'
  const routed = onRoute(request) && !otherMethod
  const problems = run.oracle.violations(op, answer, routed, request.method === 'HEAD')
  if (otherMethod && onRoute(request)) {
    if (answer.status < 400) problems.push(`answered ${answer.status} to a method no operation of the path takes`)
    const allow = (answer.headers.get('allow') ?? '').split(/\s*,\s*/)
    if (answer.status === 405 && !allow.includes(op.method)) problems.push(`405 whose Allow does not name ${op.method}`)
  }
  const invalid = routed ? requestProblems(run.oracle, op, request) : []
  // Refused at the door on any path (a limit may answer first): never read as something else, such as a 404 of a name with the escape in it.
  const door = doorProblems(op, request, routed)
  if (door.length > 0 && ![400, 414, 431].includes(answer.status))
    problems.push(`answered ${answer.status} to a URL refused at the door (${door[0]})`)
  if (routed && mutation?.refused && needsCredential(op)) invalid.push('a bad credential')
  if (invalid.length > 0 && answer.status < 300) problems.push(`accepted what the document refuses (${invalid[0]})`)
  // A body the document takes (JSON, or none where none is needed) is never "not JSON".
  const error = (answer.body as { error?: unknown } | null)?.error
  if (routed && invalid.length === 0 && answer.status === 400 && error === 'invalid_json') problems.push('a body of the document called not JSON')
  if (routed && invalid.length === 0 && answer.status === 400 && mutation?.where !== 'credential') {
    outcome.stricter.add(`${op.operationId} ${label}: ${(answer.body as { message?: string }).message}`)
  }
  if (before && answer.status >= 400) {
    const after = await readBack(run)
    const changed = Object.keys(after).filter(part => after[part] !== before[part])
    if (changed.length > 0) problems.push(`a refused write changed ${changed.join(', ')}`)
  }
  const seen = `${request.method} ${request.path} -> ${answer.status} ${JSON.stringify(answer.body)?.slice(0, 300)}`
  for (const problem of problems) outcome.findings.push({ operationId: op.operationId, label, problem, seen })
  return answer
}

/** Whether an operation takes no request without a credential. */
const needsCredential = (op: Operation) => (op.security ?? []).length > 0 && op.security!.every(requirement => Object.keys(requirement).length > 0)

/** Every table's digest, and what the agents' polls read (their inboxes live in Redis). */
async function readBack({ ctx, world }: Run): Promise<Record<string, string>> {
  const poll = async (agent: TestAgent) =>
    JSON.stringify((await send(ctx.app, { method: 'GET', path: '/v1/agent/events', params: {}, query: [], headers: asAgent(agent) })).body)
  return { ...(await stateDigest(ctx.deps.sql)), poll: await poll(world.agent), targetPoll: await poll(world.target) }
}
