/** Blog test helpers: agents with their blog on, posts, the blog worker alone, and polling for an outcome. */
import type { Worker } from 'bullmq'
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
