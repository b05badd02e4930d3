/** Publication by the blog worker: scheduled posts at their time, auto-publish, stale jobs, the sweep. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { Queue, type Job } from 'bullmq'
import { createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { blogAgent, setBlog, startBlogWorker, writePost } from './helpers/blog.ts'
import { until } from './helpers/until.ts'
import { holdOpen } from './helpers/held-transaction.ts'
import { holdDeactivation, lockWaited } from './helpers/deactivation.ts'
import { blogQueueName, createBlogQueue } from '../src/blog/queue.ts'
import { publishDuePosts, publishScheduledPost } from '../src/blog/publish.ts'
import { createLog } from '../src/log.ts'
import { createPost } from '../src/blog/posts.ts'
import { findParticipant } from '../src/participants/store.ts'
import type { AppError } from '../src/errors.ts'
import { randomUUID } from 'node:crypto'
import { unscheduleAgentPosts } from '../src/participants/deactivate.ts'
import { closeRedis, connectRedis, createRedis } from '../src/redis.ts'
import { startRedisServer } from './helpers/redis-server.ts'

let ctx: TestContext
let owner: TestUser
let agent: TestAgent
let worker: ReturnType<typeof startBlogWorker>
let queue: Queue

beforeAll(async () => {
  ctx = await createTestContext()
  owner = await signUp(ctx)
  agent = await blogAgent(ctx, owner)
  worker = startBlogWorker(ctx)
  await worker.worker.waitUntilReady()
  queue = new Queue(blogQueueName, { connection: ctx.deps.redis, prefix: ctx.deps.keys.bullPrefix })
})
afterAll(async () => {
  await worker.close()
  await queue.close()
  await ctx.close()
})

const inSeconds = (seconds: number) => new Date(ctx.clock.now().getTime() + seconds * 1000).toISOString()
const publicStatus = async (slug: string) => (await ctx.call('GET', `/blog/${agent.name}/posts/${slug}`)).status

/** The publish jobs the API enqueued for a post, whatever their state. */
async function jobsOf(postId: string): Promise<Job[]> {
  const jobs = await queue.getJobs(['completed', 'failed', 'delayed', 'waiting', 'active', 'prioritized'])
  return jobs.filter(job => job.data?.postId === postId)
}

describe('scheduled posts', () => {
  test('a post scheduled 2 s ahead is not public before its time and is public within moments after', async () => {
    const publishAt = inSeconds(2)
    const post = await writePost(ctx, agent, { title: 'Two Seconds', publishAt })
    expect(post.status).toBe('scheduled')
    expect(await publicStatus(post.slug)).toBe(404)
    let lastHidden = Date.now()
    await until(async () => {
      const status = await publicStatus(post.slug)
      if (status === 404) lastHidden = Date.now()
      return status === 200
    })
    const seen = await ctx.call('GET', `/blog/${agent.name}/posts/${post.slug}`)
    expect(seen.body.data).toMatchObject({ status: 'published', publishAt: null })
    expect(Date.parse(seen.body.data.publishedAt)).toBeGreaterThanOrEqual(Date.parse(publishAt) - 50)
    // It was still hidden shortly before its time.
    expect(lastHidden).toBeGreaterThanOrEqual(Date.parse(publishAt) - 400)
  })

  test('a rescheduled post is not published by the job of its old time', async () => {
    const post = await writePost(ctx, agent, { title: 'Moved Later', publishAt: inSeconds(60) })
    const later = inSeconds(3600)
    expect((await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { publishAt: later } })).status).toBe(200)
    // The old time's job is taken out (a minute ahead, it cannot be running yet); one left behind
    // (Redis away at the change) does nothing when it runs.
    const states = await Promise.all((await jobsOf(post.id)).map(async job => [job.data.version, await job.getState()]))
    expect(states).toEqual([[1, 'delayed']])
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(false)
    const now = await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })
    expect(now.body.data).toMatchObject({ status: 'scheduled', publishAt: later, publishedAt: null })
    expect(await publicStatus(post.slug)).toBe(404)
  })

  test('a scheduled post taken back to draft stays a draft: its old job is gone, and run anyway publishes nothing', async () => {
    const post = await writePost(ctx, agent, { title: 'Called Off', publishAt: inSeconds(60) })
    await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { status: 'draft' } })
    expect(await jobsOf(post.id)).toEqual([])
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(false)
    expect((await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data.status).toBe('draft')
    expect(await publicStatus(post.slug)).toBe(404)
  })

  test('a deleted scheduled post never appears', async () => {
    const post = await writePost(ctx, agent, { title: 'Never Seen', publishAt: inSeconds(60) })
    await ctx.call('DELETE', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })
    expect(await jobsOf(post.id)).toEqual([])
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(false)
    expect(await publicStatus(post.slug)).toBe(404)
    const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts where id = ${post.id}`
    expect(row!.n).toBe(0)
    const feed = await ctx.call('GET', '/blog/feed?limit=50')
    expect(feed.body.data.map((item: { id: string }) => item.id)).not.toContain(post.id)
  })

  test('a post rescheduled over and over keeps one job waiting in Redis, and none once deleted', async () => {
    const post = await writePost(ctx, agent, { title: 'Moved Often', publishAt: inSeconds(300 * 86_400) })
    for (let i = 1; i <= 5; i++) {
      const body = i === 3 ? { status: 'draft' } : { publishAt: inSeconds((300 + i) * 86_400) }
      expect((await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body })).status).toBe(200)
    }
    const waiting = await jobsOf(post.id)
    expect(await Promise.all(waiting.map(async job => [job.data.version, await job.getState()]))).toEqual([[5, 'delayed']])
    expect((await ctx.call('DELETE', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).status).toBe(200)
    expect(await jobsOf(post.id)).toEqual([])
  })

  test('a publish job run before its post’s time publishes nothing: the plan of that number may be another', async () => {
    // After Postgres went back (a backup restored), plans are numbered again from where it was, and
    // the queue may hold a lost plan's job of the same number and id, due sooner (postgres-going-back.test.ts).
    const post = await writePost(ctx, agent, { title: 'Not Yet', publishAt: inSeconds(3600) })
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(false)
    expect((await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data.status).toBe('scheduled')
    expect(await publicStatus(post.slug)).toBe(404)
  })

  test('running a publish job again changes nothing', async () => {
    const post = await writePost(ctx, agent, { title: 'Once Only', publishAt: inSeconds(3600) })
    ctx.clock.advance(3_600_000)
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(true)
    const first = (await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data
    ctx.clock.advance(1000)
    expect(await publishScheduledPost(ctx.deps, { postId: post.id, version: 0 })).toBe(false)
    const second = (await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data
    expect(second).toEqual(first)
  })
})

describe('two changes of one post at once', () => {
  const patch = (id: string, body: unknown) => ctx.call('PATCH', `/blog/posts/${id}`, { apiKey: agent.apiKey, body })
  const pendingStates = ['delayed', 'waiting', 'active', 'prioritized']

  test('two PATCHes at once, with the worker running: the post goes live at the time its row ends with, or stays a draft', async () => {
    // The row's lock puts the two in one order and each makes a new plan number, which its job carries:
    // whichever job runs, only the row's last plan publishes, and not before that plan's time.
    const posts = await Promise.all(Array.from({ length: 8 }, (_, i) => writePost(ctx, agent, { title: `Raced ${i}`, publishAt: inSeconds(60) })))
    // Times taken once the posts are written, with room for sixteen PATCHes on a loaded host: a time
    // passed before its PATCH is read is 400 (it must lie in the future), not the race under test.
    const pairs = Array.from({ length: 4 }, () => [
      [{ publishAt: inSeconds(6) }, { publishAt: inSeconds(8) }],
      [{ publishAt: inSeconds(6) }, { status: 'draft' }],
    ]).flat()
    const answers = await Promise.all(pairs.flatMap(([a, b], i) => [patch(posts[i].id, a), patch(posts[i].id, b)]))
    expect(answers.map(res => res.status)).toEqual(answers.map(() => 200))
    const rows = await Promise.all(posts.map(async post => (await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data))
    // Past every time set, with no job of these posts left to run: up to 40 s on a loaded host, within
    // the test's own timeout, so that jobs that never settle fail with the wait's message, not the runner's.
    const last = Date.parse(pairs[0]![1]!.publishAt!)
    await until(async () => {
      if (ctx.clock.now().getTime() <= last) return false
      const jobs = (await Promise.all(posts.map(post => jobsOf(post.id)))).flat()
      const states = await Promise.all(jobs.map(job => job.getState()))
      return states.every(state => !pendingStates.includes(state))
    }, 40_000)
    for (const [i, row] of rows.entries()) {
      const now = (await ctx.call('GET', `/blog/posts/${posts[i].id}`, { apiKey: agent.apiKey })).body.data
      if (row.status === 'draft') {
        expect(now).toMatchObject({ status: 'draft', publishedAt: null })
        expect(await publicStatus(now.slug)).toBe(404)
      } else {
        expect(row.status).toBe('scheduled')
        expect(now.status).toBe('published')
        expect(Date.parse(now.publishedAt)).toBeGreaterThanOrEqual(Date.parse(row.publishAt))
      }
    }
  }, 60_000)

  test('a plan replaced before its job reached Redis leaves no job behind', async () => {
    // The first PATCH has committed its plan but not yet enqueued its job when the second replaces the
    // plan and removes that job (not there yet): the first's job would then wait, doing nothing, until its time.
    const post = await writePost(ctx, agent, { title: 'Overtaken', publishAt: inSeconds(300 * 86_400) })
    const later = inSeconds(302 * 86_400)
    const blogQueue = ctx.deps.blogQueue
    const { schedule, unschedule } = blogQueue
    let removed!: () => void
    const firstRemoved = new Promise<void>(resolve => (removed = resolve))
    let enqueuing!: () => void
    const firstEnqueuing = new Promise<void>(resolve => (enqueuing = resolve))
    blogQueue.schedule = async (job, at) => {
      if (job.postId === post.id && job.version === 1) {
        enqueuing()
        await firstRemoved
      }
      return schedule(job, at)
    }
    blogQueue.unschedule = async job => {
      const taken = await unschedule(job)
      if (job.postId === post.id && job.version === 1) removed()
      return taken
    }
    try {
      const first = patch(post.id, { publishAt: inSeconds(301 * 86_400) })
      await firstEnqueuing
      expect((await patch(post.id, { publishAt: later })).status).toBe(200)
      expect((await first).status).toBe(200)
    } finally {
      blogQueue.schedule = schedule
      blogQueue.unschedule = unschedule
    }
    const waiting = await jobsOf(post.id)
    expect(await Promise.all(waiting.map(async job => [job.data.version, await job.getState()]))).toEqual([[2, 'delayed']])
    const row = (await ctx.call('GET', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })).body.data
    expect(row).toMatchObject({ status: 'scheduled', publishAt: later })
  })
  test('a post deleted as a change of its time commits takes that change’s job with it', async () => {
    // The delete read the post at its first plan; a change then made plan 1 and queued its job before
    // the delete had the row: the job to take out is plan 1's, the one the deleted row had.
    const post = await writePost(ctx, agent, { title: 'Moved Then Gone', publishAt: inSeconds(300 * 86_400) })
    const later = new Date(Date.parse(inSeconds(301 * 86_400)))
    const commitChange = await holdOpen(
      ctx.deps.sql,
      tx => tx`update blog_posts set publish_at = ${later}, schedule_version = 1 where id = ${post.id}`,
    )
    let deleting: Promise<{ status: number }> | undefined
    try {
      deleting = ctx.call('DELETE', `/blog/posts/${post.id}`, { apiKey: agent.apiKey })
      await lockWaited(ctx.deps.sql)
      await ctx.deps.blogQueue.schedule({ postId: post.id, version: 1 }, later)
    } finally {
      await commitChange()
    }
    expect((await deleting).status).toBe(200)
    // As the change does after its commit: the job of the plan it replaced.
    await ctx.deps.blogQueue.unschedule({ postId: post.id, version: 0 })
    const left = await jobsOf(post.id)
    expect(await Promise.all(left.map(async job => [job.data.version, await job.getState()]))).toEqual([])
  })
})

describe('auto-publish (the fourth row of the state table)', () => {
  test('with blogAutoPublish on, a new post goes live within 5 s without a publish step', async () => {
    const auto = await blogAgent(ctx, owner)
    await setBlog(ctx, owner, auto, { blogAutoPublish: true })
    const post = await writePost(ctx, auto, { title: 'Straight Out' })
    expect(post.status).toBe('scheduled')
    const took = await until(async () => (await ctx.call('GET', `/blog/${auto.name}/posts/${post.slug}`)).status === 200, 5000)
    expect(took).toBeLessThan(5000)
    const feed = await ctx.call('GET', '/blog/feed?limit=50')
    expect(feed.body.data.map((item: { id: string }) => item.id)).toContain(post.id)
  })
})

describe('the worker', () => {
  test('the sweep publishes a due post whose job was lost', async () => {
    const post = await writePost(ctx, agent, { title: 'Lost Job', publishAt: inSeconds(600) })
    for (const job of await jobsOf(post.id)) await job.remove()
    ctx.clock.advance(601_000)
    await queue.add('sweep', {})
    await until(async () => (await publicStatus(post.slug)) === 200)
  })

  test('a post whose time comes while its blog is off is published without telling its owner it went live', async () => {
    const quiet = await blogAgent(ctx, owner)
    const post = await writePost(ctx, quiet, { title: 'While Off', publishAt: inSeconds(600) })
    await setBlog(ctx, owner, quiet, { blogEnabled: false })
    // Its job, run here rather than by the worker, so its announcement (if any) is over when it returns.
    const [job] = await jobsOf(post.id)
    await job!.remove()
    ctx.clock.advance(601_000)
    expect(await publishScheduledPost(ctx.deps, job!.data)).toBe(true)
    const announced = (await ctx.deps.redis.xrange(ctx.deps.keys.events.user(owner.id), '-', '+'))
      .filter(([, fields]) => fields[1] === 'blog.published')
      .map(([, fields]) => JSON.parse(fields[3]!).postId)
    expect(announced).not.toContain(post.id)
    expect((await ctx.call('GET', `/blog/${quiet.name}/posts/${post.slug}`)).status).toBe(404)
    await setBlog(ctx, owner, quiet, { blogEnabled: true })
    expect((await ctx.call('GET', `/blog/${quiet.name}/posts/${post.slug}`)).status).toBe(200)
  })

  test('a job with bad data fails at once, without retries', async () => {
    const job = await queue.add('publish', { postId: 'not-a-post' }, { attempts: 5 })
    await until(async () => (await job.getState()) === 'failed')
    const failed = (await queue.getJob(job.id!))!
    expect(failed.attemptsMade).toBe(1)
    expect(failed.failedReason).toContain('not a blog job')
  })

  test('the delay is counted on the injected clock, not the wall clock', async () => {
    ctx.clock.advance(86_400_000)
    const post = await writePost(ctx, agent, { title: 'Clockwork', publishAt: inSeconds(1) })
    const took = await until(async () => (await publicStatus(post.slug)) === 200)
    expect(took).toBeLessThan(6000)
  })
})

describe('the log', () => {
  test('the sweep publishing hundreds of posts at once writes one line a log collector keeps whole (under 16 KiB)', async () => {
    // Posts scheduled for one moment whose jobs Redis lost: the sweep publishes them together.
    const bulk = await blogAgent(ctx, owner)
    const due = new Date(ctx.clock.now().getTime() - 1000)
    await ctx.deps.sql`
      insert into blog_posts (participant_id, title, slug, content, status, publish_at, created_at, updated_at)
      select ${bulk.id}, 'Bulk ' || i, 'bulk-' || i, 'Body text.', 'scheduled', ${due}, ${due}, ${due}
      from generate_series(1, 600) as i
    `
    const lines: string[] = []
    expect(await publishDuePosts({ ...ctx.deps, log: createLog('info', line => lines.push(line)) })).toBe(600)
    expect(lines.length).toBe(1)
    expect(Buffer.byteLength(`${lines[0]}\n`)).toBeLessThanOrEqual(16 * 1024)
    const record = JSON.parse(lines[0]!)
    expect(record.msg).toBe('blog posts published by the sweep')
    expect(record.postIds.at(-1)).toBe('… (cut from 600 items)')
  })
})

describe('an agent deactivated while a post of its is written', () => {
  test('the post is 404, as for any deactivated agent, not a 500; nothing is written or scheduled', async () => {
    const gone = await blogAgent(ctx, owner)
    const found = (await findParticipant(ctx.deps.sql, gone.id))!
    // The writer found its agent active, and its content is being rendered while the owner deactivates it.
    let release!: () => void
    const rendering = new Promise<void>(resolve => (release = resolve))
    let started!: () => void
    const renderStarted = new Promise<void>(resolve => (started = resolve))
    const markdown = {
      ...ctx.deps.markdown,
      render: async (text: string) => {
        started()
        await rendering
        return ctx.deps.markdown.render(text)
      },
    }
    const written = createPost({ ...ctx.deps, markdown }, found, { title: 'Last Words', content: 'Body.', publishAt: inSeconds(60) }).then(
      post => ({ post }),
      (error: AppError) => ({ status: error.status, code: error.code }),
    )
    await renderStarted
    expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
    release()
    expect(await written).toEqual({ status: 404, code: 'not_found' })
    const [row] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts where participant_id = ${gone.id}`
    expect(row!.n).toBe(0)
  })
})

describe('an agent deactivated while a post of its is changed', () => {
  const stored = async (id: string) => (await ctx.deps.sql`select title, status from blog_posts where id = ${id}`)[0]

  test('the change waits for a deactivation in flight, then is 404 and changes nothing', async () => {
    const gone = await blogAgent(ctx, owner)
    const post = await writePost(ctx, gone, { title: 'Before', publish: false })
    const held = await holdDeactivation(ctx.deps.sql, { id: gone.id, ownerId: owner.id })
    const changing = ctx.call('PATCH', `/blog/posts/${post.id}`, { token: owner.token, body: { title: 'After', status: 'published' } })
    await held.commitOnceWaited()
    expectError(await changing, 404, 'not_found')
    expect(await stored(post.id)).toEqual({ title: 'Before', status: 'draft' })
  })

  test('a change that waited for the post while the deactivation committed is 404 and changes nothing, not a 500', async () => {
    const gone = await blogAgent(ctx, owner)
    const post = await writePost(ctx, gone, { title: 'Before', publish: false })
    const release = await holdOpen(ctx.deps.sql, tx => tx`select 1 from blog_posts where id = ${post.id} for update`)
    let changing: ReturnType<typeof ctx.call>
    try {
      changing = ctx.call('PATCH', `/blog/posts/${post.id}`, { token: owner.token, body: { title: 'After', status: 'published' } })
      await lockWaited(ctx.deps.sql)
      expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
    } finally {
      await release()
    }
    expectError(await changing, 404, 'not_found')
    expect(await stored(post.id)).toEqual({ title: 'Before', status: 'draft' })
  })
})

describe('a scheduled post of an agent deactivated before its time', () => {
  // The contract keeps a deactivated agent's data as it was ("its data stays"): nothing publishes it.
  const stored = async (id: string) =>
    (await ctx.deps.sql`select status, published_at as "publishedAt", first_published_at as "firstPublishedAt" from blog_posts where id = ${id}`)[0]
  const untouched = { status: 'scheduled', publishedAt: null, firstPublishedAt: null }

  test('stays scheduled: its job and the sweep skip it', async () => {
    const gone = await blogAgent(ctx, owner)
    const post = await writePost(ctx, gone, { title: 'Never Out', publishAt: inSeconds(600) })
    // Its job, run here rather than by the worker, once its time has come.
    const [job] = await jobsOf(post.id)
    await job!.remove()
    expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
    ctx.clock.advance(601_000)
    expect(await publishScheduledPost(ctx.deps, job!.data)).toBe(false)
    await publishDuePosts(ctx.deps)
    expect(await stored(post.id)).toEqual(untouched)
  })

  test('its publish jobs leave Redis with the deactivation; another agent’s stay', async () => {
    // Due up to a year away, they would otherwise wait there all that time, to do nothing: the contract
    // has no way back for a deactivated agent.
    const gone = await blogAgent(ctx, owner)
    const posts = [
      await writePost(ctx, gone, { title: 'Far Off', publishAt: inSeconds(300 * 86_400) }),
      await writePost(ctx, gone, { title: 'Moved Once', publishAt: inSeconds(600) }),
    ]
    expect((await ctx.call('PATCH', `/blog/posts/${posts[1]!.id}`, { apiKey: gone.apiKey, body: { publishAt: inSeconds(900) } })).status).toBe(200)
    const other = await writePost(ctx, agent, { title: 'Still Coming', publishAt: inSeconds(600) })
    for (const post of posts) expect(await jobsOf(post.id)).toHaveLength(1)
    expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
    for (const post of posts) expect((await jobsOf(post.id)).map(job => job.id)).toEqual([])
    expect(await Promise.all((await jobsOf(other.id)).map(job => job.getState()))).toEqual(['delayed'])
    for (const post of posts) expect(await stored(post.id)).toEqual(untouched)
  })

  test('a plan whose job reaches Redis after the deactivation took the agent’s jobs out is taken out too', async () => {
    // The PATCH committed its plan before the deactivation, which then took the agent's jobs out of
    // Redis before that plan's job was there: it would have waited until its time, to do nothing.
    const gone = await blogAgent(ctx, owner)
    const post = await writePost(ctx, gone, { title: 'Late Job', publishAt: inSeconds(300 * 86_400) })
    const blogQueue = ctx.deps.blogQueue
    const { schedule } = blogQueue
    let enqueuing!: () => void
    const planEnqueuing = new Promise<void>(resolve => (enqueuing = resolve))
    let deactivated!: () => void
    const agentGone = new Promise<void>(resolve => (deactivated = resolve))
    blogQueue.schedule = async (job, at) => {
      if (job.postId === post.id && job.version === 1) {
        enqueuing()
        await agentGone
      }
      return schedule(job, at)
    }
    try {
      const patched = ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: gone.apiKey, body: { publishAt: inSeconds(301 * 86_400) } })
      await planEnqueuing
      expect((await ctx.call('DELETE', `/v1/participants/${gone.id}`, { token: owner.token })).status).toBe(200)
      deactivated()
      expect((await patched).status).toBe(200)
    } finally {
      blogQueue.schedule = schedule
    }
    expect((await jobsOf(post.id)).map(job => job.id)).toEqual([])
  })

  test('a job that runs as the deactivation commits waits for it, then skips the post', async () => {
    const gone = await blogAgent(ctx, owner)
    const post = await writePost(ctx, gone, { title: 'Never Out Either', publishAt: inSeconds(600) })
    const [job] = await jobsOf(post.id)
    await job!.remove()
    ctx.clock.advance(601_000)
    const held = await holdDeactivation(ctx.deps.sql, { id: gone.id, ownerId: owner.id })
    const publishing = publishScheduledPost(ctx.deps, job!.data)
    await held.commitOnceWaited()
    expect(await publishing).toBe(false)
    expect(await stored(post.id)).toEqual(untouched)
  })
})

describe('a deactivated agent’s publish jobs while Redis is away', () => {
  test('are given up at the first batch Redis could not take, not tried and waited for one by one', async () => {
    // The deactivation's answer waits for these removals: with Redis stalled, each batch waits out the
    // command timeout (3 s), so an agent with thousands of scheduled posts held the owner's DELETE for
    // minutes, and logged a warning per job. A job left behind publishes nothing when its time comes.
    const server = await startRedisServer()
    const lines: { msg: string }[] = []
    const log = createLog('debug', line => lines.push(JSON.parse(line)))
    const redis = createRedis(server.url, log, 'commands', 'blog-queue-away')
    await connectRedis(redis, server.url)
    const blogQueue = createBlogQueue({ redis, keys: ctx.deps.keys, clock: ctx.clock, log })
    try {
      await blogQueue.schedule({ postId: randomUUID(), version: 1 }, new Date(inSeconds(600)))
      await server.down({ keepData: true })
      const plans = Array.from({ length: 250 }, () => ({ postId: randomUUID(), version: 1 }))
      await unscheduleAgentPosts(blogQueue, plans)
      const notRemoved = lines.filter(line => line.msg.startsWith('stale blog publish job not removed'))
      expect(notRemoved.length).toBeGreaterThan(0)
      expect(notRemoved.length).toBeLessThanOrEqual(100)
    } finally {
      await blogQueue.close()
      await closeRedis(redis)
      await server.close()
    }
  }, 30_000)
})
