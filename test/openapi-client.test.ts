/** A client generated from the live document (openapi-typescript, openapi-fetch) compiles against it and walks a real flow. */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { createTestContext, signUp, type TestContext, type TestUser } from './helpers/context.ts'

let ctx: TestContext
let server: ReturnType<TestContext['app']['listen']>
let owner: TestUser
let subscriber: TestUser
// Inside node_modules, so that the copy finds openapi-fetch and TypeScript's libraries as the repository does.
let dir: string

beforeAll(async () => {
  ctx = await createTestContext({ actors: true })
  server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
  owner = await signUp(ctx)
  subscriber = await signUp(ctx)
  mkdirSync(join(import.meta.dir, '../node_modules/.cache'), { recursive: true })
  dir = mkdtempSync(join(import.meta.dir, '../node_modules/.cache/openapi-client-'))
})
afterAll(async () => {
  rmSync(dir, { recursive: true, force: true })
  await server?.stop()
  await ctx.close()
})

/** Runs a package's command with Node (as `npx` would) and fails with what it printed. */
async function run(command: string[]) {
  const child = Bun.spawn(['node', ...command], { cwd: dir, stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text(), child.exited])
  if (code !== 0) throw new Error(`${command.slice(0, 2).join(' ')} failed (${code}):\n${stdout}${stderr}`)
}

const tsconfig = {
  compilerOptions: {
    target: 'ES2022',
    module: 'ESNext',
    moduleResolution: 'bundler',
    lib: ['ES2022', 'DOM'],
    types: [],
    strict: true,
    noUncheckedIndexedAccess: true,
    noUnusedLocals: true,
    verbatimModuleSyntax: true,
    allowImportingTsExtensions: true,
    skipLibCheck: true,
    noEmit: true,
  },
  files: ['flow.ts', 'api.ts'],
}

test('types generated from /swagger/json compile with the client code, and the client walks a real flow', async () => {
  const baseUrl = `http://127.0.0.1:${server.server!.port}`
  // The README's command, against the running server.
  await run([require.resolve('openapi-typescript/bin/cli.js'), `${baseUrl}/swagger/json`, '-o', join(dir, 'api.ts')])
  copyFileSync(join(import.meta.dir, 'client/flow.ts'), join(dir, 'flow.ts'))
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify(tsconfig))
  // Type errors in the generated types or in the client code fail here, naming the file and line.
  await run([require.resolve('typescript/bin/tsc'), '-p', 'tsconfig.json'])

  const { walk } = (await import(join(dir, 'flow.ts'))) as { walk: (baseUrl: string, tokens: object, name: string) => Promise<any> }
  const name = `walked-${crypto.randomUUID().slice(0, 8)}`
  const walked = await walk(baseUrl, { owner: owner.token, subscriber: subscriber.token }, name)

  expect(walked.profile.id).toBe(subscriber.id)
  expect(walked.agent).toMatchObject({ name, displayName: 'Walked Agent', apiKey: expect.stringMatching(/^sk_agt_/) })
  expect(walked.plans.map((plan: { id: string }) => plan.id)).toEqual([walked.plan.id])
  expect(walked.subscription).toMatchObject({ planId: walked.plan.id, participantId: walked.agent.id, status: 'active' })
  expect(walked.refused).toMatchObject({ success: false, statusCode: 409, error: 'already_subscribed' })
  expect(walked.message).toMatchObject({ role: 'user', text: 'Hello, agent' })
  expect(walked.events.pendingConversations).toEqual([
    expect.objectContaining({ userId: subscriber.id, latestMessage: 'Hello, agent', pendingCount: 1 }),
  ])
  expect(walked.reply).toMatchObject({ userId: subscriber.id, text: 'Hello, subscriber' })
  expect(walked.invoices).toEqual([expect.objectContaining({ id: walked.purchase.invoiceId, totalCents: 300, status: 'issued' })])
  expect(walked.draft.status).toBe('draft')
  expect(walked.published).toMatchObject({ id: walked.draft.id, status: 'published', url: `http://test.local/@${name}/blog/walked-through` })
  // What the client did is what the service holds.
  const page = await fetch(`${baseUrl}/@${name}/blog/walked-through`)
  expect(page.status).toBe(200)
  expect(await page.text()).toContain('<em>written</em>')
}, 60_000)
