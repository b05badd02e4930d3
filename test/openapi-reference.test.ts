/** The reference page (/swagger) in a real browser: it renders every operation, and loads nothing from anywhere but the service. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { chromium as playwright, type Browser } from 'playwright-core'
import { createTestContext, type TestContext } from './helpers/context.ts'
import { chromium, chromiumArgs } from './helpers/chromium.ts'

let ctx: TestContext
let server: ReturnType<TestContext['app']['listen']>
let browser: Browser

beforeAll(async () => {
  ctx = await createTestContext()
  server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  browser = await playwright.launch({ executablePath: await chromium(), args: chromiumArgs })
  // Installing Chromium, when it is missing, takes a while.
}, 600_000)
afterAll(async () => {
  await browser?.close()
  await server?.stop()
  await ctx.close()
})

test('/swagger renders every operation of the document, with no request to any other host', async () => {
  const origin = `http://127.0.0.1:${server.server!.port}`
  const doc = (await ctx.call('GET', '/swagger/json')).body
  const operations = Object.values<Record<string, unknown>>(doc.paths).flatMap(item => Object.keys(item))
  const context = await browser.newContext()
  const requested: string[] = []
  const elsewhere: string[] = []
  // Anything not for the service is refused as well as recorded: the test itself sends nothing out.
  await context.route('**/*', route => {
    const url = route.request().url()
    requested.push(url)
    if (new URL(url).origin === origin) return route.continue()
    elsewhere.push(url)
    return route.abort()
  })
  const page = await context.newPage()
  const problems: string[] = []
  page.on('console', message => {
    if (message.type() === 'error') problems.push(message.text())
  })
  page.on('pageerror', error => problems.push(error.message))

  const response = await page.goto(`${origin}/swagger`)
  expect(response?.status()).toBe(200)
  await page.locator('.opblock').first().waitFor({ timeout: 30_000 })
  expect(await page.locator('.opblock').count()).toBe(operations.length)
  expect(await page.locator('.info .title').textContent()).toContain('Agent Marketplace API')
  const paths = await page.locator('.opblock-summary-path').allTextContents()
  for (const path of ['/v1/billing/plans/{id}', '/v1/agent/events', '/blog/posts'])
    expect(paths.map(text => text.replace(/\u200b/g, ''))).toContain(path)
  await page.locator('.models').scrollIntoViewIfNeeded()
  expect(await page.locator('.models').textContent()).toContain('ErrorEnvelope')

  expect(elsewhere).toEqual([])
  expect(requested.map(url => new URL(url).pathname)).toEqual(
    expect.arrayContaining(['/swagger', '/swagger/json', '/swagger/assets/swagger-ui-bundle.js']),
  )
  // The page's policy blocked nothing it needs, and the UI raised no error.
  expect(problems).toEqual([])
  await context.close()
}, 60_000)
