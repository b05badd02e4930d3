/**
 * The API behind nginx, as a deployment runs it: an upstream keep-alive pool, the proxy settings
 * docs/operations.md gives, real API processes. nginx is installed when missing (test/helpers/nginx.ts).
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { proxiedDeployments, requestFrom, steadyLoad } from './helpers/behind-proxy.ts'
import { documented, startNginx, type Nginx } from './helpers/nginx.ts'
import { exitWithin } from './helpers/processes.ts'

const { deployment, startApi, cleanup } = proxiedDeployments('reverse-proxy')
const proxies: Nginx[] = []

afterAll(async () => {
  await Promise.all(proxies.map(proxy => proxy.stop()))
  await cleanup()
})

/**
 * Closed TCP connections to or from `port`, by who holds them in TIME_WAIT: the side that closed
 * first, for 60 s after. The API's side is in /proc/net/tcp6 (it listens on `::`), nginx's in tcp.
 */
function closedFirstBy(port: number): { server: number; client: number } {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0')
  const rows = ['/proc/net/tcp', '/proc/net/tcp6'].flatMap(file => readFileSync(file, 'utf8').split('\n').slice(1))
  const counts = { server: 0, client: 0 }
  for (const row of rows) {
    const [, local, remote, state] = row.trim().split(/\s+/)
    if (state !== '06') continue
    if (local?.endsWith(`:${hexPort}`)) counts.server++
    else if (remote?.endsWith(`:${hexPort}`)) counts.client++
  }
  return counts
}

/** POST /v1/auth/device-codes through `url` from the local address `from` (127.0.0.x: a client other than nginx), with any extra header lines. */
async function createDeviceCode(url: string, from: string, extra = ''): Promise<number> {
  return (await requestFrom(url, from, 'POST', '/v1/auth/device-codes', extra)).status
}

describe('behind nginx', () => {
  test(
    'idle upstream connections are closed by nginx at its keepalive_timeout (60 s), never first by the API: no 502 from a request sent as the API closes one',
    async () => {
      const { port } = await startApi((await deployment())())
      const proxy = await startNginx([port])
      proxies.push(proxy)
      // Fills nginx's pool: each of these concurrent requests takes a connection of its own, kept idle after.
      const burst = () =>
        Promise.all(
          Array.from({ length: 20 }, () =>
            fetch(`${proxy.url}/v1/participants`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: '{}',
            }).then(response => response.status),
          ),
        )
      expect(new Set(await burst())).toEqual(new Set([400]))
      // Past nginx's 60 s: with the API's old 30 s, the API had closed each one first, and a request
      // nginx sent on one as it closed was answered 502 (Bun closes idle connections in 4 s ticks,
      // all at once: 50 of 3,150 POSTs sent around such a tick were 502).
      await Bun.sleep(62_000)
      const closed = closedFirstBy(port)
      expect(closed.server).toBe(0)
      expect(closed.client).toBeGreaterThan(0)
      expect(new Set(await burst())).toEqual(new Set([400]))
      expect(proxy.errorLog()).not.toContain('upstream prematurely closed')
    },
    { timeout: 120_000 },
  )

  test('a rolling restart of two API processes behind nginx as documented: nginx always has a server, and every answer is the API’s', async () => {
    const env = await deployment()
    const settings = {
      SHUTDOWN_DELAY_MS: '1000',
      RATE_LIMITS: JSON.stringify({
        participantCreate: { capacity: 100_000, perSeconds: 1 },
      }),
    }
    const apis = [await startApi(env(settings)), await startApi(env(settings))]
    // With nginx's default max_fails=1, a process that refused a connection was left out for 10 s
    // (fail_timeout) after it was back, and the other one's drain then left no server: "no live
    // upstreams", 502 to everything (108 of 1,647 answers in a rolling restart under load).
    const proxy = await startNginx(
      apis.map(api => api.port),
      { server: documented.server },
    )
    proxies.push(proxy)
    const load = steadyLoad(proxy.url, 6)
    await Bun.sleep(1000)
    for (const [index, api] of apis.entries()) {
      api.started.proc.kill('SIGTERM')
      expect(await exitWithin(api.started.proc, 15_000)).toBe(0)
      apis[index] = await startApi(api.env)
    }
    await Bun.sleep(1000)
    const { failures, requests, streamsOpened } = await load.stop()
    // The one 502 left: a listener's close ends a connection nginx sent a POST on just then (a GET
    // it sends again), as docs/limits.md has it; each such 502 is that POST's line in nginx's log, a
    // reset, or a premature close when the API's FIN reached nginx before the reset did.
    const log = proxy.errorLog().split('\n')
    const ended =
      /\(104: Connection reset by peer\) while reading response header|upstream prematurely closed connection while reading response header/
    const resets = log.filter(line => line.includes('request: "POST /v1/participants ') && ended.test(line)).length
    // What nginx logged besides refused connections (each retried on the other server), should this fail.
    if (failures.length > resets) console.error(log.filter(line => line.includes('[error]') && !line.includes('connect() failed')).join('\n'))
    expect(failures.filter(failure => !failure.startsWith('POST /v1/participants: 502'))).toEqual([])
    expect(failures.length).toBeLessThanOrEqual(resets)
    expect(requests).toBeGreaterThan(100)
    // Each drain ended the streams it held; they were opened again through nginx.
    expect(streamsOpened).toBeGreaterThan(2)
    expect(proxy.errorLog()).not.toContain('no live upstreams')
  }, 90_000)

  test('per-IP limits count each client by the address nginx appends to X-Forwarded-For; what a client writes there itself changes nothing', async () => {
    const limits = JSON.stringify({
      deviceCodeCreate: { capacity: 2, perSeconds: 3600 },
    })
    const { port } = await startApi(
      (await deployment())({
        TRUSTED_PROXIES: '127.0.0.1',
        RATE_LIMITS: limits,
      }),
    )
    const proxy = await startNginx([port])
    proxies.push(proxy)
    const spoofed = 'x-forwarded-for: 198.51.100.7\r\n'
    expect(await createDeviceCode(proxy.url, '127.0.0.2')).toBe(201)
    expect(await createDeviceCode(proxy.url, '127.0.0.2', spoofed)).toBe(201)
    // What the client writes, a loopback hop too, is left of the address nginx appends: still 127.0.0.2's bucket.
    expect(await createDeviceCode(proxy.url, '127.0.0.2', `x-forwarded-for: 198.51.100.8, 127.0.0.9\r\n`)).toBe(429)
    expect(await createDeviceCode(proxy.url, '127.0.0.3')).toBe(201)

    // Without TRUSTED_PROXIES every client is nginx's address: one bucket for all of them.
    const shared = await startApi((await deployment())({ RATE_LIMITS: limits }))
    const plain = await startNginx([shared.port])
    proxies.push(plain)
    expect(await createDeviceCode(plain.url, '127.0.0.2')).toBe(201)
    expect(await createDeviceCode(plain.url, '127.0.0.3')).toBe(201)
    expect(await createDeviceCode(plain.url, '127.0.0.4')).toBe(429)
  }, 60_000)
})
