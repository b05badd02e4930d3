/**
 * One attacker at full speed on one vector: `concurrency` loops, each sending its next request as soon
 * as the last is answered, until the time is up. Runs in a process of its own (`runAttacker`), so its
 * work does not delay the well-behaved agents' event loop and their timings.
 */
import { randomBytes, randomUUID } from 'node:crypto'
import { join } from 'node:path'
import type { Attacker } from './abuse-seed.ts'
import { wallClock } from './abuse-recorder.ts'

export const vectors = ['service-requests', 'device-polls', 'device-guesses', 'proxy-calls', 'messages', 'replies', 'agent-creation'] as const
export type Vector = (typeof vectors)[number]

export interface AttackPlan {
  /** The API's base URL: 127.0.0.1 only. */
  api: string
  vector: Vector
  seconds: number
  concurrency: number
  attacker: Attacker
  /** The well-behaved agent the service requests are sent to. */
  targetAgentId: string
  /** The well-behaved agent the attacker's subscriber floods with messages. */
  floodedAgentId: string
}

export interface AttackResult {
  /** When the first request was sent and the last answered (wallClock). */
  from: number
  to: number
  requests: number
  /** Answers by status, `network` for requests that got none. */
  statuses: Record<string, number>
}

interface AttackRequest {
  method: string
  path: string
  headers: Record<string, string>
  body?: unknown
}

const userCodeAlphabet = 'BCDFGHJKLMNPQRSTVWXZ'
const requestTimeoutMs = 15_000

/** The n-th request of a vector. */
function request(plan: AttackPlan, n: number): AttackRequest {
  const { attacker } = plan
  const asAgent = { 'x-api-key': attacker.agentKey }
  const asOwner = { authorization: `Bearer ${attacker.ownerToken}` }
  const asSubscriber = { authorization: `Bearer ${attacker.subscriberToken}` }
  switch (plan.vector) {
    case 'service-requests':
      return { method: 'POST', path: '/v1/agent/service-requests', headers: asAgent, body: { targetAgentId: plan.targetAgentId, input: bigInput } }
    case 'device-polls':
      return { method: 'GET', path: `/v1/auth/device-codes/${randomUUID()}`, headers: {} }
    case 'device-guesses':
      return { method: 'PATCH', path: `/v1/auth/device-codes/${randomUserCode()}`, headers: asOwner, body: { action: 'approve' } }
    case 'proxy-calls':
      return {
        method: 'POST',
        path: '/v1/agent/proxy-call',
        headers: asAgent,
        body: { userId: attacker.subscriberId, provider: 'slow', method: 'GET', path: '/big' },
      }
    case 'messages':
      return { method: 'POST', path: `/v1/conversations/${plan.floodedAgentId}/messages`, headers: asSubscriber, body: { text: bigText } }
    case 'replies':
      // Every other reply to the user who unsubscribed.
      return {
        method: 'POST',
        path: '/v1/agent/conversation-reply',
        headers: asAgent,
        body: { userId: n % 2 ? attacker.lapsedId : attacker.subscriberId, text: bigText },
      }
    case 'agent-creation':
      return { method: 'POST', path: '/v1/participants', headers: asOwner, body: { name: `abuse-${n}-${randomBytes(4).toString('hex')}` } }
  }
}

// The largest each route takes.
const bigInput = 'x'.repeat(50_000)
const bigText = 'x'.repeat(10_000)

function randomUserCode(): string {
  const letters = Array.from(randomBytes(8), byte => userCodeAlphabet[byte % userCodeAlphabet.length]).join('')
  return `${letters.slice(0, 4)}-${letters.slice(4)}`
}

export async function attack(plan: AttackPlan): Promise<AttackResult> {
  if (new URL(plan.api).hostname !== '127.0.0.1') throw new Error('the attacker only sends to 127.0.0.1')
  const statuses: Record<string, number> = {}
  const from = wallClock()
  const deadline = from + plan.seconds * 1000
  let sent = 0
  const loop = async () => {
    while (wallClock() < deadline) {
      const r = request(plan, sent++)
      let status: string
      try {
        const response = await fetch(plan.api + r.path, {
          method: r.method,
          headers: r.body === undefined ? r.headers : { ...r.headers, 'content-type': 'application/json' },
          body: r.body === undefined ? undefined : JSON.stringify(r.body),
          signal: AbortSignal.timeout(requestTimeoutMs),
        })
        await response.arrayBuffer()
        status = String(response.status)
      } catch {
        status = 'network'
      }
      statuses[status] = (statuses[status] ?? 0) + 1
    }
  }
  await Promise.all(Array.from({ length: plan.concurrency }, loop))
  return { from, to: wallClock(), requests: sent, statuses }
}

/** Runs `attack(plan)` in a child Bun process (inheriting this one's CPU affinity); killed if it overstays by 30 s. */
export async function runAttacker(plan: AttackPlan): Promise<AttackResult> {
  const child = Bun.spawn([process.execPath, join(import.meta.dir, 'abuse-attacker.ts'), JSON.stringify(plan)], {
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'inherit',
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), (plan.seconds + 30) * 1000)
  const [output, code] = await Promise.all([new Response(child.stdout).text(), child.exited])
  clearTimeout(timer)
  if (code !== 0) throw new Error(`the ${plan.vector} attacker exited with ${code}`)
  return JSON.parse(output) as AttackResult
}

if (import.meta.main) {
  const plan = JSON.parse(process.argv[2]!) as AttackPlan
  console.log(JSON.stringify(await attack(plan)))
}
