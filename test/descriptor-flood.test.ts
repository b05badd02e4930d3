/** An API process at its open-file limit, its descriptors taken by a flood of idle connections. */
import { afterAll, expect, test } from 'bun:test'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { deleteKeys, randomPrefix, userToken } from './helpers/context.ts'
import { createTestDatabase, type TestDatabase } from './helpers/database.ts'
import { freePort } from './helpers/ports.ts'
import { deploymentEnv, processGroup } from './helpers/processes.ts'
import { until } from './helpers/until.ts'

const limit = 256
const root = mkdtempSync(join(tmpdir(), 'am-fd-flood-'))
const { start, killAll } = processGroup()
const prefix = randomPrefix()
const databases: TestDatabase[] = []
const flood: Socket[] = []

afterAll(async () => {
  for (const socket of flood) socket.destroy()
  await killAll()
  await Promise.all(databases.map(database => database.drop()))
  await deleteKeys(prefix)
  rmSync(root, { recursive: true, force: true })
})

/** A kept-alive connection, for requests sent while no new connection can be accepted. */
async function keptAlive(port: number) {
  const socket = connect(port, '127.0.0.1')
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject))
  return {
    /** Sends one request; resolves with its status line, or 'closed' when the connection ends first. */
    send(method: string, path: string, token: string, body?: unknown): Promise<string> {
      const text = body === undefined ? '' : JSON.stringify(body)
      return new Promise(resolve => {
        let answer = ''
        const onData = (data: Buffer) => {
          answer += data.toString()
          if (!answer.includes('\r\n')) return
          socket.off('close', onClose)
          socket.off('data', onData)
          resolve(answer.slice(0, answer.indexOf('\r\n')))
        }
        const onClose = () => resolve('closed')
        socket.on('data', onData).once('close', onClose)
        socket.write(
          `${method} ${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\n` +
            `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n\r\n${text}`,
        )
      })
    },
  }
}

/** An API process under the low limit, healthy; its own database. */
async function startApi(overrides: Record<string, string> = {}) {
  databases.push(await createTestDatabase())
  const port = await freePort()
  const env = deploymentEnv(root, prefix, { DATABASE_URL: databases.at(-1)!.url, PORT: String(port), ...overrides })
  const api = start(['src/main.ts', '--api'], env, ['prlimit', `--nofile=${limit}:${limit}`, '--', process.execPath])
  await until(async () => (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.status === 200, 20_000)
  return { port, api }
}

/** Connects until every descriptor of the process is taken and more connections wait to be accepted. */
async function fill(port: number, pid: number) {
  for (let i = 0; i < limit + 50; i++) flood.push(connect(port, '127.0.0.1').on('error', () => {}))
  await until(async () => readdirSync(`/proc/${pid}/fd`).length >= limit, 10_000)
}

/** Ends the flood; the process serves new connections again. */
async function drain(port: number) {
  for (const socket of flood.splice(0)) socket.destroy()
  await until(async () => (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.status === 200, 10_000)
}

test('a blog post written while idle connections hold every descriptor starts its renderer; the process lives', async () => {
  const { port, api } = await startApi()
  const token = await userToken('fd-flood-owner')
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' }
  const created = await fetch(`http://127.0.0.1:${port}/v1/participants`, { method: 'POST', headers, body: '{"name":"fd-flood-bot"}' })
  const agent = ((await created.json()) as { data: { id: string } }).data
  const enabled = await fetch(`http://127.0.0.1:${port}/v1/participants/${agent.id}`, {
    method: 'PATCH',
    headers,
    body: '{"settings":{"blogEnabled":true}}',
  })
  expect(enabled.status).toBe(200)

  // The process's first render starts its thread: only once every descriptor is taken, and more
  // connections wait to be accepted (Bun takes any descriptor freed at once).
  const writer = await keptAlive(port)
  await fill(port, api.proc.pid)
  const answer = await writer.send('POST', '/blog/posts', token, { participantId: agent.id, title: 'Full', content: '# Full' })

  expect(answer).toBe('HTTP/1.1 201 Created')
  expect(api.proc.exitCode).toBeNull()
  await drain(port)
}, 40_000)

test('a JWT whose keys are fetched while idle connections hold every descriptor is 503; the process lives', async () => {
  // Nothing listens there: the keys cannot be fetched, with or without a descriptor for the connection.
  const { port, api } = await startApi({ AUTH_JWKS_URL: `http://127.0.0.1:${await freePort()}/jwks` })
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const token = `${part({ alg: 'RS256', kid: 'k' })}.${part({ sub: 'a', exp: Math.floor(Date.now() / 1000) + 600 })}.c2ln`
  // The process's first fetch: Bun starts its HTTP client's thread for it.
  const client = await keptAlive(port)
  await fill(port, api.proc.pid)
  const answer = await client.send('GET', '/v1/auth/me', token)

  expect(answer).toBe('HTTP/1.1 503 Service Unavailable')
  expect(api.proc.exitCode).toBeNull()
  await drain(port)
}, 40_000)
