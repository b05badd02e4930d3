/**
 * An owner's dashboard on another origin than the API, in a real browser (Chromium): what a page on
 * an origin in CORS_ORIGINS may send and read (bearer calls, a revert under an Idempotency-Key, the
 * errors with their headers, the notification stream through a one-use token), and that the browser
 * refuses a page on any other origin.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chromium as playwright, type Browser, type Page } from 'playwright-core'
import { createTestContext, signUp, type TestContext, type TestUser } from './helpers/context.ts'
import { chromium, chromiumArgs } from './helpers/chromium.ts'

/** What a page's script got from one fetch: the answer it could read, or the error fetch threw. */
type Seen = { status: number; headers: Record<string, string | null>; body: any } | { thrown: string }

/** A page server of its own: every path answers the same empty page, whose script the test drives. */
function servePages() {
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    fetch: () => new Response('<!doctype html><title>dashboard</title>', { headers: { 'content-type': 'text/html' } }),
  })
  return { origin: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) }
}

const dashboard = servePages()
const elsewhere = servePages()
let ctx: TestContext
let api: ReturnType<TestContext['app']['listen']>
let apiOrigin: string
let browser: Browser

beforeAll(async () => {
  ctx = await createTestContext({
    actors: true,
    // Three writes an hour per user: the fourth is a 429 the page must be able to read.
    env: { CORS_ORIGINS: dashboard.origin, RATE_LIMITS: JSON.stringify({ contextWrite: { capacity: 3, perSeconds: 3600 } }) },
  })
  api = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  // Another port, so another origin than both page servers.
  apiOrigin = `http://127.0.0.1:${api.server!.port}`
  browser = await playwright.launch({ executablePath: await chromium(), args: chromiumArgs })
  // Installing Chromium, when it is missing, takes a while.
}, 600_000)
afterAll(async () => {
  await browser?.close()
  await api?.stop()
  await dashboard.stop()
  await elsewhere.stop()
  await ctx.close()
})

/** A page loaded from `origin`, with the console's errors (the browser's reasons for a refusal) collected. */
async function pageOn(origin: string): Promise<{ page: Page; console: string[] }> {
  const page = await browser.newPage()
  const console: string[] = []
  page.on('console', message => {
    if (message.type() === 'error') console.push(message.text())
  })
  await page.goto(`${origin}/`)
  return { page, console }
}

/** One fetch made by the page's script, as a dashboard makes it: the API's URL, a JSON body, the given headers. */
function fetchFrom(page: Page, path: string, init: { method?: string; token?: string; body?: unknown; headers?: Record<string, string> } = {}) {
  return page.evaluate(
    async ({ url, init, read }): Promise<Seen> => {
      const headers: Record<string, string> = { ...init.headers }
      if (init.token) headers.authorization = `Bearer ${init.token}`
      if (init.body !== undefined) headers['content-type'] = 'application/json'
      try {
        const response = await fetch(url, {
          method: init.method ?? 'GET',
          headers,
          body: init.body === undefined ? undefined : JSON.stringify(init.body),
        })
        const text = await response.text()
        return {
          status: response.status,
          headers: Object.fromEntries(read.map(name => [name, response.headers.get(name)])),
          body: text === '' ? null : JSON.parse(text),
        }
      } catch (error) {
        return { thrown: String(error) }
      }
    },
    { url: `${apiOrigin}${path}`, init, read: ['retry-after', 'www-authenticate', 'allow', 'content-type'] },
  )
}

/** The browser's EventSource, as much of it as the page's script uses (the test's types are Bun's, not the DOM's). */
interface PageGlobals {
  EventSource: new (url: string) => {
    readyState: number
    onopen: () => void
    onerror: () => void
    addEventListener(type: string, listener: (message: { lastEventId: string; data: string }) => void): void
    close(): void
  }
  heard: Promise<{ id: string; data: any }>
}

/**
 * Opens the owner's notification stream as a dashboard does (a token from POST /v1/auth/sse-token,
 * then EventSource on the stream's URL with it) and says whether it opened; `heard(page)` then
 * resolves with its first event of `type`.
 */
function openStream(
  page: Page,
  credential: { bearer: string } | { streamToken: string },
  type: string,
  after = '',
): Promise<{ issued: Seen; state: 'open' | 'refused' }> {
  return page.evaluate(
    async ({ apiOrigin, credential, type, after }) => {
      let issued: Seen
      if ('streamToken' in credential) issued = { status: 200, headers: {}, body: { data: { token: credential.streamToken } } }
      else
        try {
          const headers = { authorization: `Bearer ${credential.bearer}` }
          const response = await fetch(`${apiOrigin}/v1/auth/sse-token`, { method: 'POST', headers })
          issued = { status: response.status, headers: {}, body: await response.json() }
        } catch (error) {
          return { issued: { thrown: String(error) }, state: 'refused' as const }
        }
      if (issued.status !== 200) return { issued, state: 'refused' as const }
      const page = globalThis as unknown as PageGlobals
      const resume = after === '' ? '' : `&lastEventId=${encodeURIComponent(after)}`
      const source = new page.EventSource(`${apiOrigin}/v1/events/stream?token=${encodeURIComponent(issued.body.data.token)}${resume}`)
      page.heard = new Promise(resolve =>
        source.addEventListener(type, message => {
          resolve({ id: message.lastEventId, data: JSON.parse(message.data) })
          source.close()
        }),
      )
      return new Promise<{ issued: Seen; state: 'open' | 'refused' }>(resolve => {
        source.onopen = () => resolve({ issued, state: 'open' })
        // A response the page may not read is not retried: the source closes for good.
        source.onerror = () => {
          if (source.readyState === 2) resolve({ issued, state: 'refused' })
        }
      })
    },
    { apiOrigin, credential, type, after },
  )
}

const heard = (page: Page) => page.evaluate(() => (globalThis as unknown as PageGlobals).heard)

describe('a dashboard on an origin in CORS_ORIGINS', () => {
  let user: TestUser
  beforeAll(async () => {
    user = await signUp(ctx)
  })

  test('calls with a bearer token, reverts under an Idempotency-Key, and reads 401 and 429 with their headers', async () => {
    const { page, console } = await pageOn(dashboard.origin)
    const me = await fetchFrom(page, '/v1/auth/me', { token: user.token })
    expect(me).toMatchObject({ status: 200, body: { success: true, data: { id: user.id } } })

    const stale = await fetchFrom(page, '/v1/auth/me', { token: `${user.token}x` })
    expect(stale).toMatchObject({ status: 401, body: { success: false, error: 'invalid_token' } })
    expect((stale as { headers: Record<string, string> }).headers['www-authenticate']).toStartWith('Bearer')

    for (const tone of ['warm', 'dry']) {
      const put = await fetchFrom(page, '/v1/context/tone/voice', { method: 'PUT', token: user.token, body: { data: { tone } } })
      expect(put).toMatchObject({ status: 200 })
    }
    const versions = await fetchFrom(page, '/v1/context/tone/voice/versions', { token: user.token })
    expect((versions as { body: any }).body.data.entries.map((entry: { version: number }) => entry.version)).toEqual([2, 1])

    const revert = { method: 'POST', token: user.token, body: { version: 1 }, headers: { 'idempotency-key': 'revert-to-1' } }
    const reverted = await fetchFrom(page, '/v1/context/tone/voice/revert', revert)
    expect(reverted).toMatchObject({ status: 201, body: { data: { version: 3, data: { tone: 'warm' } } } })
    // The page's retry (it never saw the answer, say) is the first answer again: no fourth version.
    expect(await fetchFrom(page, '/v1/context/tone/voice/revert', revert)).toEqual(reverted)

    const limited = await fetchFrom(page, '/v1/context/tone/voice', { method: 'PUT', token: user.token, body: { data: { tone: 'dry' } } })
    expect(limited).toMatchObject({ status: 429, body: { success: false, error: 'rate_limited' } })
    expect(Number((limited as { headers: Record<string, string> }).headers['retry-after'])).toBeGreaterThan(0)

    const wrongMethod = await fetchFrom(page, '/v1/auth/me', { method: 'DELETE', token: user.token })
    // A method the path does not take: the preflight names the ones it does, and the browser stops there.
    expect(wrongMethod).toEqual({ thrown: 'TypeError: Failed to fetch' })
    expect(console.join('\n')).toContain('Method DELETE is not allowed by Access-Control-Allow-Methods')
    await page.close()
  }, 60_000)

  test('opens the notification stream with a one-use token, hears of its own write, and reopened where it left off, of what it missed', async () => {
    const owner = await signUp(ctx)
    const { page } = await pageOn(dashboard.origin)
    expect(await openStream(page, { bearer: owner.token }, 'context.updated')).toMatchObject({ issued: { status: 200 }, state: 'open' })
    const put = await fetchFrom(page, '/v1/context/goals/q4', { method: 'PUT', token: owner.token, body: { data: { revenue: 1 } } })
    expect(put).toMatchObject({ status: 200 })
    // Heard as `context.updated` (the listener's type, and the data's); the entry's type is `entryType`.
    const event = await heard(page)
    expect(event.data).toMatchObject({ type: 'context.updated', entryType: 'goals', key: 'q4', version: 1 })
    expect(event.id).not.toBe('')
    // The token is spent (EventSource's own reconnect would send it again, and give up on the 401):
    // a dashboard reopens with a new one where it left off, and hears what it missed.
    const missed = await fetchFrom(page, '/v1/context/goals/q4', { method: 'PUT', token: owner.token, body: { data: { revenue: 2 } } })
    expect(missed).toMatchObject({ status: 200 })
    expect(await openStream(page, { bearer: owner.token }, 'context.updated', event.id)).toMatchObject({ state: 'open' })
    expect((await heard(page)).data).toMatchObject({ key: 'q4', version: 2 })
    await page.close()
  }, 60_000)
})

describe('a page on an origin not in CORS_ORIGINS', () => {
  test('is refused by the browser: its script reads nothing, and what needed a preflight was never sent', async () => {
    const user = await signUp(ctx)
    const { page, console } = await pageOn(elsewhere.origin)
    expect(await fetchFrom(page, '/v1/auth/me', { token: user.token })).toEqual({ thrown: 'TypeError: Failed to fetch' })
    const put = await fetchFrom(page, '/v1/context/tone/voice', { method: 'PUT', token: user.token, body: { data: { tone: 'x' } } })
    expect(put).toEqual({ thrown: 'TypeError: Failed to fetch' })
    expect((await ctx.call('GET', '/v1/context/tone/voice/versions', { token: user.token })).status).toBe(404)
    // A request without a preflight reaches the API, but its answer is the page's to read no more than any other.
    expect(await fetchFrom(page, '/health/live')).toEqual({ thrown: 'TypeError: Failed to fetch' })
    expect(await openStream(page, { bearer: user.token }, 'context.updated')).toMatchObject({ issued: { thrown: 'TypeError: Failed to fetch' } })
    // Nor does a stream open there with a token the page came by otherwise.
    const token = await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })
    expect(await openStream(page, { streamToken: token.body.data.token }, 'context.updated')).toMatchObject({ state: 'refused' })
    expect(console.join('\n')).toContain("has been blocked by CORS policy: Response to preflight request doesn't pass access control check")
    await page.close()
  }, 60_000)
})
