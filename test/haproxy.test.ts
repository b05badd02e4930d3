/**
 * The API behind HAProxy, configured as docs/operations.md gives: health checks on /health/ready,
 * X-Forwarded-For, a larger buffer, real API and workers processes. HAProxy is installed when missing
 * (test/helpers/haproxy.ts).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { userToken } from './helpers/context.ts'
import { proxiedDeployments, requestFrom, steadyLoad, streamFrom } from './helpers/behind-proxy.ts'
import { documented, startHaproxy, type Haproxy } from './helpers/haproxy.ts'
import { exitWithin } from './helpers/processes.ts'
import { listen } from './helpers/sse.ts'
import { until } from './helpers/until.ts'

const { deployment, startApi, startWorkers, cleanup } = proxiedDeployments('haproxy')
const proxies: Haproxy[] = []

afterAll(async () => {
  await Promise.all(proxies.map(proxy => proxy.stop()))
  await cleanup()
})

async function haproxyFor(upstreams: number[], options: Parameters<typeof startHaproxy>[1] = {}): Promise<Haproxy> {
  const proxy = await startHaproxy(upstreams, options)
  proxies.push(proxy)
  return proxy
}

/** `defaults` as documented, with other timeouts of client and server. */
const withTimeouts = (client: string, server: string) =>
  documented.defaults.replace('timeout client 30s', `timeout client ${client}`).replace('timeout server 60s', `timeout server ${server}`)

/** Chat posts as fast as a test sends them. */
const chatUnlimited = JSON.stringify({ chatPost: { capacity: 100_000, perSeconds: 1 } })

/** A JSON call through the proxy as `token`'s user. */
async function call(url: string, method: string, path: string, token: string, body?: unknown) {
  const response = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  return { status: response.status, body: (await response.json()) as any }
}

/** Reads an event stream's body until it ends or is cut; resolves with the ids of its events. */
async function readUntilCut(response: Response): Promise<string[]> {
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader()
  let text = ''
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      text += value
    }
  } catch {
    // HAProxy cut the stream: what came before is what counts.
  }
  // The events' ids (not the place a fresh stream is told alone, an id with no event).
  return [...text.matchAll(/^id: (\S+)\nevent: /gm)].map(match => match[1]!)
}

describe('event streams behind HAProxy', () => {
  test('outlive timeout client and timeout server (the 4 s pings keep them busy), and each event arrives as it happens', async () => {
    const settings = (await deployment())({ RATE_LIMITS: chatUnlimited })
    const api = await startApi(settings)
    startWorkers(settings)
    // The documented timeouts scaled down to 6 s, still above the pings: streams held 14 s outlive two.
    const proxy = await haproxyFor([api.port], { defaults: withTimeouts('6s', '6s') })
    const owner = await userToken('stream-owner')
    const notifications = listen(`${proxy.url}/v1/events/stream`, { token: owner })
    const chat = listen(`${proxy.url}/v1/events/chat`)
    const agent = await call(proxy.url, 'POST', '/v1/participants', owner, { name: 'streamed' })
    const plan = await call(proxy.url, 'POST', '/v1/billing/plans', owner, {
      participantId: agent.body.data.id,
      name: 'Basic',
      monthlyPriceCents: 100,
      includedProxyCalls: 10,
      overagePerCallCents: 1,
    })
    expect(plan.status).toBe(201)
    for (let n = 0; n < 3; n++) {
      if (n > 0) await Bun.sleep(7_000)
      expect((await call(proxy.url, 'POST', '/v1/chat/messages', owner, { text: `message ${n}` })).status).toBe(201)
      await chat.waitFor(n + 1, ['chat.message'])
    }
    const subscriber = await userToken('stream-subscriber')
    expect((await call(proxy.url, 'POST', '/v1/billing/subscriptions', subscriber, { planId: plan.body.data.id })).status).toBe(201)
    await notifications.waitFor(1, ['subscription.created'])
    // HAProxy logs a request as it ends: neither stream has ended, so neither was opened again.
    expect(proxy.log()).not.toContain('/v1/events/')
    notifications.close()
    chat.close()
    expect(chat.events.map(event => event.data.text)).toEqual(['message 0', 'message 1', 'message 2'])
  }, 40_000)

  test('a stream HAProxy cuts (timeout server under the pings; timeout tunnel plays no part) resumes with Last-Event-ID and loses nothing', async () => {
    const settings = (await deployment())({ RATE_LIMITS: chatUnlimited })
    const api = await startApi(settings)
    startWorkers(settings)
    const proxy = await haproxyFor([api.port], { defaults: `${withTimeouts('30s', '2s')}\n    timeout tunnel 1h` })
    const token = await userToken('chatter')
    const first = await fetch(`${proxy.url}/v1/events/chat`)
    expect((await call(proxy.url, 'POST', '/v1/chat/messages', token, { text: 'before the cut' })).status).toBe(201)
    const before = await readUntilCut(first)
    expect(before).toHaveLength(1)
    // sD: the server-side timeout struck during the body. HAProxy writes the request's line as the
    // stream ends, which may be just after the client saw the cut.
    const cutByServerTimeout = / sD-- .*"GET \/v1\/events\/chat HTTP\/1.1"/
    await until(async () => cutByServerTimeout.test(proxy.log()), 5000).catch(() => {})
    expect(proxy.log()).toMatch(cutByServerTimeout)
    // Posted while no stream is open: the resume replays them, then goes live.
    for (const text of ['while away 1', 'while away 2']) {
      expect((await call(proxy.url, 'POST', '/v1/chat/messages', token, { text })).status).toBe(201)
    }
    const resumed = listen(`${proxy.url}/v1/events/chat`, { lastEventId: before[0] })
    await resumed.waitFor(2, ['chat.message'])
    expect((await call(proxy.url, 'POST', '/v1/chat/messages', token, { text: 'live' })).status).toBe(201)
    const events = await resumed.waitFor(3, ['chat.message'])
    resumed.close()
    expect(events.map(event => event.data.text)).toEqual(['while away 1', 'while away 2', 'live'])
  }, 30_000)
})

describe('client addresses behind HAProxy', () => {
  test('per-IP limits and the chat-stream cap count the address option forwardfor adds; what a client writes there changes nothing', async () => {
    const { port } = await startApi(
      (await deployment())({
        TRUSTED_PROXIES: '127.0.0.1',
        RATE_LIMITS: JSON.stringify({ deviceCodeCreate: { capacity: 2, perSeconds: 3600 } }),
        CHAT_STREAMS_PER_ADDRESS: '2',
      }),
    )
    const proxy = await haproxyFor([port])
    const create = async (from: string, extra = '') => (await requestFrom(proxy.url, from, 'POST', '/v1/auth/device-codes', extra)).status
    expect(await create('127.0.0.2')).toBe(201)
    expect(await create('127.0.0.2', 'x-forwarded-for: 198.51.100.7\r\n')).toBe(201)
    // HAProxy adds a header line of its own after the client's; the API reads them joined, its own last.
    expect(await create('127.0.0.2', 'x-forwarded-for: 198.51.100.8, 127.0.0.9\r\n')).toBe(429)
    expect(await create('127.0.0.3')).toBe(201)

    const streams = [await streamFrom(proxy.url, '127.0.0.4', '/v1/events/chat'), await streamFrom(proxy.url, '127.0.0.4', '/v1/events/chat')]
    expect(streams.map(stream => stream.status)).toEqual([200, 200])
    const third = await requestFrom(proxy.url, '127.0.0.4', 'GET', '/v1/events/chat', 'x-forwarded-for: 198.51.100.9\r\n')
    expect(third.status).toBe(429)
    expect(third.text).toContain('"error":"rate_limited"')
    const other = await streamFrom(proxy.url, '127.0.0.5', '/v1/events/chat')
    expect(other.status).toBe(200)
    for (const stream of [...streams, other]) stream.socket.destroy()
  }, 30_000)
})

describe('health checks and drains behind HAProxy', () => {
  test('a rolling restart under load: each process is marked down by /health/ready before its listener closes, every answer is the API’s, and streams resume with nothing lost', async () => {
    const env = await deployment()
    const settings = {
      // Above HAProxy's time to notice: `fall 2` checks, `inter 1s` apart.
      SHUTDOWN_DELAY_MS: '3000',
      RATE_LIMITS: JSON.stringify({ participantCreate: { capacity: 100_000, perSeconds: 1 }, chatPost: { capacity: 100_000, perSeconds: 1 } }),
    }
    const apis = [await startApi(env(settings)), await startApi(env(settings))]
    startWorkers(env(settings))
    const proxy = await haproxyFor(apis.map(api => api.port))
    const chat = listen(`${proxy.url}/v1/events/chat`)
    const load = steadyLoad(proxy.url, 6)
    const poster = await userToken('poster')
    const posted: string[] = []
    let posting = true
    const posts = (async () => {
      for (let n = 0; posting; n++) {
        const text = `during the restart ${n}`
        const { status } = await call(proxy.url, 'POST', '/v1/chat/messages', poster, { text })
        if (status === 201) posted.push(text)
        await Bun.sleep(200)
      }
    })()
    for (const [index, api] of apis.entries()) {
      const ups = proxy.serverChanges().filter(change => change.startsWith(`api${index} UP`)).length
      api.started.proc.kill('SIGTERM')
      expect(await exitWithin(api.started.proc, 15_000)).toBe(0)
      apis[index] = await startApi(api.env)
      // Back in rotation (`rise 2`) before the next one drains.
      await until(async () => proxy.serverChanges().filter(change => change.startsWith(`api${index} UP`)).length > ups)
    }
    posting = false
    await posts
    const { failures, requests, streamsOpened } = await load.stop()
    expect(failures).toEqual([])
    expect(requests).toBeGreaterThan(100)
    expect(streamsOpened).toBeGreaterThan(2)
    // Each drain was seen as a 503 from /health/ready; no request or check found a listener closed.
    expect(proxy.serverChanges()).toEqual([
      'api0 DOWN Layer7 wrong status, code: 503',
      'api0 UP Layer7 check passed, code: 200',
      'api1 DOWN Layer7 wrong status, code: 503',
      'api1 UP Layer7 check passed, code: 200',
    ])
    // The stream the drains ended came back through HAProxy with Last-Event-ID: every message once, in order.
    await chat.waitFor(posted.length, ['chat.message'], 10_000)
    chat.close()
    expect(chat.events.map(event => event.data.text)).toEqual(posted)
  }, 60_000)

  test('with no process ready, HAProxy’s own 503 is in the envelope, with Retry-After', async () => {
    const api = await startApi((await deployment())({ SHUTDOWN_DELAY_MS: '5000' }))
    const proxy = await haproxyFor([api.port])
    api.started.proc.kill('SIGTERM')
    await until(async () => proxy.serverChanges().includes('api0 DOWN Layer7 wrong status, code: 503'))
    const response = await fetch(`${proxy.url}/v1/auth/me`)
    expect(response.status).toBe(503)
    expect(response.headers.get('retry-after')).toBe('1')
    expect(await response.json()).toEqual({
      success: false,
      statusCode: 503,
      error: 'unavailable',
      message: 'No API process is available; try again',
    })
  }, 30_000)
})

describe('requests and answers through HAProxy', () => {
  test('the API’s 413, 414 and 431 reach the client in the envelope; heads the API takes pass HAProxy’s buffer', async () => {
    const { port } = await startApi((await deployment())())
    const proxy = await haproxyFor([port])
    const send = (head: string, body?: Uint8Array) =>
      fetch(`${proxy.url}${head}`, { method: body ? 'POST' : 'GET', headers: { 'content-type': 'application/json' }, body })
    const envelope = async (response: Response) => ({ status: response.status, error: ((await response.json()) as any).error })
    expect(await envelope(await send(`/v1/auth/me?q=${'a'.repeat(9_000)}`))).toEqual({ status: 414, error: 'uri_too_long' })
    // 15.5 KiB of head, under the API's 16 KiB: HAProxy's default 16 KiB buffer (15 KiB for a head) answered a bare 400.
    const head = (bytes: number) => fetch(`${proxy.url}/v1/auth/me`, { headers: { 'x-padding': 'a'.repeat(bytes) } })
    expect(await envelope(await head(15_500))).toEqual({ status: 401, error: 'unauthorized' })
    expect(await envelope(await head(20_000))).toEqual({ status: 431, error: 'headers_too_large' })
    expect(await envelope(await send('/v1/participants', new Uint8Array(1_500_000).fill(32)))).toEqual({ status: 413, error: 'payload_too_large' })
  }, 30_000)

  test('with http-reuse always, clients sharing kept-alive connections to the API get their own answers, refused bodies between them', async () => {
    const { port } = await startApi((await deployment())())
    const proxy = await haproxyFor([port], { backend: `${documented.backend}\n    http-reuse always` })
    const refusedBody = new Uint8Array(1_100_000).fill(32)
    const mismatches: string[] = []
    await Promise.all(
      Array.from({ length: 8 }, async (_, index) => {
        const token = await userToken(`reuse-${index}`)
        const { body } = await call(proxy.url, 'GET', '/v1/auth/me', token)
        for (let n = 0; n < 15; n++) {
          // Read through by the API (declared, under 8 MiB), so the connection serves the next request.
          const refused = await fetch(`${proxy.url}/v1/participants`, {
            method: 'POST',
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
            body: refusedBody,
          })
          if (refused.status !== 413) mismatches.push(`POST ${refused.status}`)
          await refused.arrayBuffer()
          const me = await call(proxy.url, 'GET', '/v1/auth/me', token)
          if (me.status !== 200 || me.body.data.id !== body.data.id) mismatches.push(`GET ${me.status} ${JSON.stringify(me.body).slice(0, 80)}`)
        }
      }),
    )
    expect(mismatches).toEqual([])
  }, 30_000)
})
