/**
 * Real API processes behind a reverse proxy in tests (nginx, HAProxy): deployments sharing a
 * database and Redis prefix, a steady load through the proxy, and requests from other local addresses.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { deleteKeys, randomPrefix, userToken } from './context.ts'
import { createTestDatabase, type TestDatabase } from './database.ts'
import { deploymentEnv, processGroup, type Started } from './processes.ts'
import { freePort } from './ports.ts'
import { until } from './until.ts'

export interface Api {
  port: number
  started: Started
  /** Its environment, to start it again as it was. */
  env: Record<string, string>
}

/** The processes, databases and prefixes of one test file; `cleanup` in its afterAll. */
export function proxiedDeployments(name: string) {
  const root = mkdtempSync(join(tmpdir(), `am-${name}-`))
  const { start, killAll } = processGroup()
  const databases: TestDatabase[] = []
  const prefixes: string[] = []
  return {
    /** A database and a Redis prefix of their own, for processes that share them (`deployment(...)` each). */
    async deployment(): Promise<(overrides?: Record<string, string>) => Record<string, string>> {
      const database = await createTestDatabase()
      databases.push(database)
      const prefix = randomPrefix()
      prefixes.push(prefix)
      return (overrides = {}) => deploymentEnv(root, prefix, { DATABASE_URL: database.url, ...overrides })
    },
    /** An API process (`bun src/main.ts --api`) on a spare port (or `env`'s), once it answers /health/ready. */
    async startApi(env: Record<string, string>): Promise<Api> {
      const port = env.PORT ? Number(env.PORT) : await freePort()
      const full = { ...env, PORT: String(port) }
      const started = start(['src/main.ts', '--api'], full)
      await until(async () => {
        if (started.proc.exitCode !== null) throw new Error(`the API exited with ${started.proc.exitCode}: ${await started.stderr}`)
        return (await fetch(`http://127.0.0.1:${port}/health/ready`).catch(() => undefined))?.status === 200
      }, 20_000)
      return { port, started, env: full }
    },
    /** A workers process (`bun src/main.ts --workers`): the outbox relay that feeds event streams, among others. */
    startWorkers: (env: Record<string, string>): Started => start(['src/main.ts', '--workers'], env),
    async cleanup() {
      await killAll()
      await Promise.all(databases.map(database => database.drop()))
      await Promise.all(prefixes.map(prefix => deleteKeys(prefix)))
      rmSync(root, { recursive: true, force: true })
    },
  }
}

/** A connection to `url`'s host and port from the local address `from` (127.0.0.x: a client other than the proxy). */
function connectFrom(url: string, from: string): { socket: Socket; host: string } {
  const { hostname, port } = new URL(url)
  return { socket: connect({ host: hostname, port: Number(port), localAddress: from }), host: hostname }
}

/**
 * Sends `method path` with `extra` header lines (each ending in CRLF) and `Connection: close` through
 * `url` from the local address `from`; resolves with the status and the raw answer.
 */
export function requestFrom(url: string, from: string, method: string, path: string, extra = ''): Promise<{ status: number; text: string }> {
  const { socket, host } = connectFrom(url, from)
  return new Promise((resolve, reject) => {
    let received = ''
    const length = method === 'POST' ? 'content-length: 0\r\n' : ''
    socket.on('connect', () => socket.write(`${method} ${path} HTTP/1.1\r\nhost: ${host}\r\n${length}connection: close\r\n${extra}\r\n`))
    socket.on('data', chunk => (received += chunk.toString()))
    socket.on('end', () => resolve({ status: Number(received.split(' ')[1]), text: received }))
    socket.on('error', reject)
  })
}

/** Opens a GET of an event stream through `url` from `from`; resolves with its status once the head is in, and the socket to close. */
export function streamFrom(url: string, from: string, path: string): Promise<{ status: number; socket: Socket }> {
  const { socket, host } = connectFrom(url, from)
  return new Promise((resolve, reject) => {
    let received = ''
    socket.on('connect', () => socket.write(`GET ${path} HTTP/1.1\r\nhost: ${host}\r\n\r\n`))
    socket.on('data', chunk => {
      received += chunk.toString()
      if (received.includes('\r\n\r\n')) resolve({ status: Number(received.split(' ')[1]), socket })
    })
    socket.on('error', reject)
  })
}

/**
 * Requests through `url` until `stop()`, from `users` callers at once: each creates an agent (a write)
 * and reads its account, in turn; and two chat streams, opened again whenever they end. Resolves, at
 * stop, with every answer that was not a 2xx and the number of streams opened.
 */
export function steadyLoad(url: string, users: number) {
  let stopping = false
  const failures: string[] = []
  let requests = 0
  let streamsOpened = 0
  const call = async (method: string, path: string, token: string, body?: unknown) => {
    requests++
    const headers: Record<string, string> = {
      authorization: `Bearer ${token}`,
    }
    if (body !== undefined) headers['content-type'] = 'application/json'
    const response = await fetch(`${url}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    }).catch((error: Error) => error)
    if (response instanceof Error) failures.push(`${method} ${path}: ${response.message}`)
    else if (response.status >= 300) failures.push(`${method} ${path}: ${response.status} ${(await response.text()).slice(0, 80)}`)
    else await response.arrayBuffer()
  }
  const caller = async (index: number) => {
    const token = await userToken(`rolling-${index}`)
    for (let n = 0; !stopping; n++) {
      await call('POST', '/v1/participants', token, {
        name: `rolling-${index}-${n}`,
      })
      await call('GET', '/v1/auth/me', token)
      await Bun.sleep(50)
    }
  }
  const stream = async () => {
    while (!stopping) {
      const response = await fetch(`${url}/v1/events/chat`).catch((error: Error) => error)
      streamsOpened++
      if (response instanceof Error || response.status !== 200) {
        failures.push(`GET /v1/events/chat: ${response instanceof Error ? response.message : response.status}`)
        await Bun.sleep(100)
        continue
      }
      const reader = response.body!.getReader()
      while (!stopping && !(await reader.read()).done);
      await reader.cancel().catch(() => {})
    }
  }
  const loops = [...Array.from({ length: users }, (_, index) => caller(index)), stream(), stream()]
  return {
    async stop() {
      stopping = true
      await Promise.race([Promise.all(loops), Bun.sleep(10_000)])
      return { failures, requests, streamsOpened }
    },
  }
}
