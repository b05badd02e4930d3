/** Blog test helpers: agents with their blog on, posts, the blog worker alone, a broken or slow renderer. */
import type { Worker } from 'bullmq'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { createMarkdownRenderer, type MarkdownRenderer } from '../../src/blog/render.ts'
import type { Log } from '../../src/log.ts'
import { createRedis } from '../../src/redis.ts'
import { blogWorker } from '../../workers/blog.ts'
import { createAgent, type TestAgent, type TestContext, type TestUser } from './context.ts'

/** Changes an agent's blog settings as its owner. */
export async function setBlog(
  ctx: TestContext,
  owner: TestUser,
  agent: TestAgent,
  settings: { blogEnabled?: boolean; blogAutoPublish?: boolean },
): Promise<void> {
  const res = await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: owner.token, body: { settings } })
  if (res.status !== 200) throw new Error(`settings failed: ${res.status} ${JSON.stringify(res.body)}`)
}

/** A new agent of `owner` with its blog enabled. */
export async function blogAgent(ctx: TestContext, owner: TestUser, name?: string): Promise<TestAgent> {
  const agent = await createAgent(ctx, owner, name)
  await setBlog(ctx, owner, agent, { blogEnabled: true })
  return agent
}

/** Creates a post with the agent's key; throws unless it is 201. */
export async function writePost(ctx: TestContext, agent: TestAgent, body: Record<string, unknown>) {
  const res = await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { content: 'Body text.', ...body } })
  if (res.status !== 201) throw new Error(`post failed: ${res.status} ${JSON.stringify(res.body)}`)
  return res.body.data
}

/** The blog worker alone, on the test's deps (its clock, database and Redis prefix). */
export function startBlogWorker(ctx: TestContext): { worker: Worker; close(): Promise<void> } {
  const connection = createRedis(ctx.config.redisUrl, ctx.deps.log, 'bullmq')
  const worker = blogWorker(ctx.deps, connection)
  return {
    worker,
    async close() {
      await worker.close()
      await connection.quit().catch(() => connection.disconnect())
    },
  }
}

/** A renderer whose thread's module cannot load, as after a broken deploy; `close` also removes that module. */
export function brokenRenderer(log: Log): MarkdownRenderer {
  return rendererWithModule(log, "throw new Error('a broken deploy')\n")
}

/**
 * A renderer whose thread loads slowly, as on a machine busy for a moment: the first thread started
 * spins for `spinMs` before loading the real module, later ones load at once.
 */
export function slowLoadingRenderer(log: Log, spinMs: number, options: { timeoutMs?: number } = {}): MarkdownRenderer {
  const real = fileURLToPath(new URL('../../src/blog/render-worker.ts', import.meta.url))
  // Static imports, run in order: a top-level await would let the thread take messages before it listens.
  return rendererWithModule(log, `import './spin.ts'\nimport ${JSON.stringify(real)}\n`, options, dir => {
    const once = JSON.stringify(join(dir, 'spun'))
    const spin = `if (!existsSync(${once})) {\n  writeFileSync(${once}, '')\n  const end = Date.now() + ${spinMs}\n  while (Date.now() < end) {}\n}\n`
    writeFileSync(join(dir, 'spin.ts'), `import { existsSync, writeFileSync } from 'node:fs'\n${spin}`)
  })
}

/** A renderer whose thread runs `source` (beside what `more` writes in its directory); `close` removes them. */
function rendererWithModule(
  log: Log,
  source: string,
  options: { timeoutMs?: number } = {},
  more: (dir: string) => void = () => {},
): MarkdownRenderer {
  const dir = mkdtempSync(join(tmpdir(), 'am-render-'))
  const module = join(dir, 'worker.ts')
  writeFileSync(module, source)
  more(dir)
  const renderer = createMarkdownRenderer({ log, ...options, workerUrl: pathToFileURL(module).href })
  return {
    render: text => renderer.render(text),
    async close() {
      await renderer.close()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
