import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { createAgent, createTestContext, expectError, redisUrl, signUp, type TestContext, type TestUser } from './helpers/context.ts'
import { listen, serve } from './helpers/sse.ts'
import { randomUUID } from 'node:crypto'
import { connect, type Socket } from 'node:net'
import { createEventHub, maxStreamsPerUser } from '../src/events/hub.ts'
import { createRedis, type Redis } from '../src/redis.ts'
import { createPubSub } from '../src/pubsub.ts'
import { until } from './helpers/until.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { enqueueEvents } from '../src/events/outbox.ts'

let ctx: TestContext
let server: { url: string; stop(): Promise<void> }

beforeAll(async () => {
  ctx = await createTestContext({ actors: true })
  server = serve(ctx.app)
})
afterAll(async () => {
  await server.stop()
  await ctx.close()
})

async function ownerWithPlan() {
  const owner = await signUp(ctx)
  const agent = await createAgent(ctx, owner)
  const plan = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'P', monthlyPriceCents: 100, includedProxyCalls: 1, overagePerCallCents: 1 },
  })
  return { owner, agent, planId: plan.body.data.id as string }
}

async function rawStream(path: string, headers: Record<string, string> = {}) {
  const response = await fetch(`${server.url}${path}`, { headers })
  return response
}

describe('the owner’s notification stream', () => {
  test('a subscription, a review, a purchase and a conversation message arrive as their event types with payloads', async () => {
    const { owner, agent, planId } = await ownerWithPlan()
    const stream = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await Bun.sleep(100)
    const user = await signUp(ctx)
    const sub = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
    await ctx.call('POST', '/v1/billing/reviews', { token: user.token, body: { participantId: agent.id, rating: 4, comment: 'ok' } })
    const config = await ctx.call('POST', '/v1/billing/configs', {
      token: owner.token,
      body: { participantId: agent.id, name: 'C', priceCents: 250, fileType: 'md', content: 'c' },
    })
    const purchase = await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: user.token })
    const message = await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'hello owner' } })
    const events = await stream.waitFor(4)
    stream.close()
    expect(events.map(e => e.type)).toEqual(['subscription.created', 'review.created', 'config.purchased', 'conversation.message'])
    expect(events[0]!.data).toMatchObject({
      type: 'subscription.created',
      subscriptionId: sub.body.data.id,
      participantId: agent.id,
      planId,
      userId: user.id,
    })
    expect(events[1]!.data).toMatchObject({ type: 'review.created', participantId: agent.id, userId: user.id, rating: 4, comment: 'ok' })
    expect(events[2]!.data).toMatchObject({ type: 'config.purchased', purchaseId: purchase.body.data.purchaseId, priceCents: 250, userId: user.id })
    expect(events[3]!.data).toMatchObject({
      type: 'conversation.message',
      participantId: agent.id,
      userId: user.id,
      messageId: message.body.data.id,
      text: 'hello owner',
    })
    for (const event of events) {
      expect(event.id).toMatch(/^\d+-\d+$/)
      expect(event.data.createdAt).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/)
    }
  })

  test('deactivating an agent tells its owner of each subscription it ended', async () => {
    const { owner, agent, planId } = await ownerWithPlan()
    const users = [await signUp(ctx), await signUp(ctx)]
    const subscriptions: string[] = []
    for (const user of users) {
      subscriptions.push((await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })).body.data.id)
    }
    const stream = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await Bun.sleep(100)
    // One cancelled by its subscriber first: its owner is told then, and not again.
    await ctx.call('DELETE', `/v1/billing/subscriptions/${subscriptions[0]}`, { token: users[0]!.token })
    const cancelled = ['subscription.cancelled']
    await stream.waitFor(1, cancelled)
    expect((await ctx.call('DELETE', `/v1/participants/${agent.id}`, { token: owner.token })).status).toBe(200)
    await stream.waitFor(2, cancelled)
    await Bun.sleep(300)
    stream.close()
    const received = stream.events.filter(e => e.type === 'subscription.cancelled')
    expect(received.map(e => e.data.subscriptionId)).toEqual([subscriptions[0], subscriptions[1]])
    expect(received[1]!.data).toMatchObject({ participantId: agent.id, planId, userId: users[1]!.id })
  })

  test('the subscriber hears the reply; owners of target and requester hear about service requests; users hear context changes', async () => {
    const { owner, agent, planId } = await ownerWithPlan()
    const user = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
    const userStream = listen(`${server.url}/v1/events/stream`, { token: user.token })
    const other = await ownerWithPlan()
    const requesterStream = listen(`${server.url}/v1/events/stream`, { token: other.owner.token })
    const targetStream = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await Bun.sleep(100)
    await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text: 'q' } })
    await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: agent.apiKey, body: { userId: user.id, text: 'a' } })
    await ctx.call('POST', '/v1/agent/context', { apiKey: agent.apiKey, body: { userId: user.id, type: 'goals', key: 'g', data: { x: 1 } } })
    const request = await ctx.call('POST', '/v1/agent/service-requests', {
      apiKey: other.agent.apiKey,
      body: { targetAgentId: agent.id, input: 'do' },
    })
    await ctx.call('POST', '/v1/agent/service-respond', {
      apiKey: agent.apiKey,
      body: { requestId: request.body.data.requestId, output: 'done', success: true },
    })
    const forUser = await userStream.waitFor(2)
    // Two actors (the agent, the organization) tell the user; nothing orders one's notifications after
    // the other's (the reply's goes out after its answer).
    expect(forUser.map(e => e.type).sort()).toEqual(['context.updated', 'conversation.reply'])
    expect(forUser.find(e => e.type === 'context.updated')!.data).toMatchObject({ type: 'context.updated', entryType: 'goals', key: 'g', version: 1 })
    const forTarget = await targetStream.waitFor(1, ['service.requested'])
    expect(forTarget[0]!.data).toMatchObject({ requestId: request.body.data.requestId, fromAgentId: other.agent.id })
    const forRequester = await requesterStream.waitFor(1, ['service.completed'])
    expect(forRequester[0]!.data).toMatchObject({ requestId: request.body.data.requestId, targetAgentId: agent.id })
    for (const s of [userStream, requesterStream, targetStream]) s.close()
  })

  test('the payer hears of the invoice for a purchase, and the owner of a post going live', async () => {
    const { owner, agent } = await ownerWithPlan()
    const buyer = await signUp(ctx)
    const buyerStream = listen(`${server.url}/v1/events/stream`, { token: buyer.token })
    const ownerStream = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await Bun.sleep(100)
    const config = await ctx.call('POST', '/v1/billing/configs', {
      token: owner.token,
      body: { participantId: agent.id, name: 'C', priceCents: 99, fileType: 'md', content: 'c' },
    })
    const purchase = await ctx.call('POST', `/v1/billing/configs/${config.body.data.id}/purchase`, { token: buyer.token })
    await ctx.call('PATCH', `/v1/participants/${agent.id}`, { token: owner.token, body: { settings: { blogEnabled: true } } })
    const post = await ctx.call('POST', '/blog/posts', {
      token: owner.token,
      body: { participantId: agent.id, title: 'Hello world', content: 'Hi', publish: true },
    })
    const [invoice] = await buyerStream.waitFor(1, ['invoice.issued'])
    expect(invoice!.data).toMatchObject({ invoiceId: purchase.body.data.invoiceId, totalCents: 99 })
    const [published] = await ownerStream.waitFor(1, ['blog.published'])
    expect(published!.data).toMatchObject({ postId: post.body.data.id, participantId: agent.id, slug: 'hello-world' })
    buyerStream.close()
    ownerStream.close()
  })

  test('an event caused through instance A reaches a client connected to instance B', async () => {
    const b = await createTestContext({ database: ctx.database, env: { REDIS_PREFIX: ctx.config.redisPrefix } })
    const serverB = serve(b.app)
    try {
      const { owner, planId } = await ownerWithPlan()
      const stream = listen(`${serverB.url}/v1/events/stream`, { token: owner.token })
      await until(async () => b.deps.events.size === 1)
      const user = await signUp(ctx)
      await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
      const [event] = await stream.waitFor(1)
      expect(event!.type).toBe('subscription.created')
      stream.close()
    } finally {
      await serverB.stop()
      await b.close()
    }
  })

  test('a client that misses three events gets exactly those, in order, on reconnect, then live ones', async () => {
    const { owner, agent, planId } = await ownerWithPlan()
    const first = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await Bun.sleep(100)
    const u1 = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: u1.token, body: { planId } })
    const [seen] = await first.waitFor(1)
    first.close()
    const missed: string[] = []
    for (let i = 0; i < 3; i++) {
      const res = await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: u1.token, body: { text: `missed ${i}` } })
      missed.push(res.body.data.id)
    }
    const again = listen(`${server.url}/v1/events/stream`, { token: owner.token, lastEventId: seen!.id })
    const replayed = await again.waitFor(3)
    expect(replayed.map(e => e.data.messageId)).toEqual(missed)
    await ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: u1.token, body: { text: 'live' } })
    const all = await again.waitFor(4)
    expect(all.map(e => e.data.text)).toEqual(['missed 0', 'missed 1', 'missed 2', 'live'])
    expect(new Set(all.map(e => e.id)).size).toBe(4)
    again.close()
  })
})

describe('a resume from an event the stream no longer holds', () => {
  /** The raw text of a stream resumed from `lastEventId`, read until it holds `until`. */
  const resumeUntil = async (token: string, lastEventId: string, until: string) => {
    const reader = (await rawStream('/v1/events/stream', { authorization: `Bearer ${token}`, 'last-event-id': lastEventId })).body!.getReader()
    const decoder = new TextDecoder()
    let text = ''
    const deadline = Date.now() + 5000
    while (!text.includes(until) && Date.now() < deadline) {
      const { value, done } = await reader.read()
      if (done) break
      text += decoder.decode(value)
    }
    await reader.cancel()
    return text
  }

  test('Redis lost it: told that events may be missing (events.missed) before what the stream holds; a resume from a kept one is not', async () => {
    const { owner, agent, planId } = await ownerWithPlan()
    const user = await signUp(ctx)
    await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })
    const stream = ctx.deps.keys.events.user(owner.id)
    const write = (text: string) => ctx.call('POST', `/v1/conversations/${agent.id}/messages`, { token: user.token, body: { text } })
    // The subscription's event is in the stream before the client listens: a stream opened afresh starts after it.
    await until(async () => (await ctx.deps.redis.xlen(stream)) === 1)
    const first = listen(`${server.url}/v1/events/stream`, { token: owner.token })
    await first.opened
    await write('seen')
    const [seen] = await first.waitFor(1)
    first.close()
    await write('gone 0')
    await write('gone 1')
    await until(async () => (await ctx.deps.redis.xlen(stream)) === 4)
    // Redis still holds the client's last event: the replay is whole, and says nothing more.
    const whole = await resumeUntil(owner.token, seen!.id, 'gone 1')
    expect(whole).toContain('gone 0')
    expect(whole).not.toContain('events.missed')
    // Redis loses the stream (a restart without its data), then takes the next event.
    await ctx.deps.redis.del(stream)
    await write('after')
    await until(async () => (await ctx.deps.redis.xlen(stream)) === 1)
    const text = await resumeUntil(owner.token, seen!.id, 'after')
    expect(text).not.toContain('gone 0')
    const missed = /event: events\.missed\ndata: (.*)\n\n/.exec(text)
    expect(missed).not.toBeNull()
    expect(JSON.parse(missed![1]!)).toMatchObject({ type: 'events.missed', after: seen!.id })
    expect(text.indexOf('events.missed')).toBeLessThan(text.indexOf('after'))
  })

  /** Appends `count` chat messages to `stream` directly; their ids. */
  const addEvents = async (stream: string, count: number) => {
    const adds = ctx.deps.redis.pipeline()
    for (let n = 0; n < count; n++) adds.xadd(stream, '*', 'type', 'chat.message', 'data', JSON.stringify({ type: 'chat.message', n }))
    return (await adds.exec())!.map(([, id]) => id as string)
  }

  /** The start of `stream` resumed from `lastEventId`: its first two frames after the retry. */
  const resumeStart = async (stream: string, lastEventId: string) => {
    const reader = (await ctx.deps.events.open({ stream, lastEventId })).body!.getReader()
    const decoder = new TextDecoder()
    let text = ''
    while (text.split('\n\n').length < 4) text += decoder.decode((await reader.read()).value)
    await reader.cancel()
    return text.split('\n\n').slice(1, 3)
  }

  test('a resume from more events back than the stream keeps is told so too', async () => {
    const stream = ctx.deps.keys.events.user(randomUUID())
    const added = await addEvents(stream, 1002)
    const start = (lastEventId: string) => resumeStart(stream, lastEventId)
    // 1,001 came after the first: the newest 1,000 are replayed, the one before them is missing.
    const [notice, next] = await start(added[0]!)
    // Every event carries an id (CONTRACT.md §8): the notice's is the resume's own place.
    expect(notice).toStartWith(`id: ${added[0]}\nevent: events.missed\ndata: `)
    expect(next).toStartWith(`id: ${added[2]}\n`)
    // 1,000 after the second: every one is replayed, nothing is missing.
    expect((await start(added[1]!))[0]).toStartWith(`id: ${added[2]}\n`)
    expect((await start(`0${added[1]}`))[0]).toStartWith(`id: ${added[2]}\n`)
    await ctx.deps.redis.del(stream)
  })

  test('a resume from an empty stream’s place (0-0) is told so when the stream kept or held more than it replays', async () => {
    // 0-0 is the place a stream opened afresh on an empty stream is given (`id: 0-0`): its client
    // resumes from there, and every event after it is one it has not read.
    const stream = ctx.deps.keys.events.user(randomUUID())
    const add = (count: number) => addEvents(stream, count)
    const start = (lastEventId: string) => resumeStart(stream, lastEventId)
    try {
      // All of them replayed: nothing to tell.
      const kept = await add(1000)
      expect((await start('0-0'))[0]).toStartWith(`id: ${kept[0]}\n`)
      // One more than the replay sends, held by the stream: the oldest is not sent.
      await add(1)
      const [notice, next] = await start('0-0')
      expect(notice).toStartWith('id: 0-0\nevent: events.missed\ndata: ')
      expect(JSON.parse(notice!.slice(notice!.indexOf('data: ') + 6))).toMatchObject({ type: 'events.missed', after: '0-0' })
      expect(next).toStartWith(`id: ${kept[1]}\n`)
      // Trimmed to what it keeps (as its appends trim it): the replay is all it holds, and the first is gone.
      await ctx.deps.redis.xtrim(stream, 'MAXLEN', 1000)
      const [trimmed, first] = await start('0-0')
      expect(trimmed).toStartWith('id: 0-0\nevent: events.missed\ndata: ')
      expect(first).toStartWith(`id: ${kept[1]}\n`)
    } finally {
      await ctx.deps.redis.del(stream)
    }
  })
})

describe('the wire format and limits', () => {
  test('opens with retry: 3000 and pings within 5 s', async () => {
    const user = await signUp(ctx)
    const response = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toContain('text/event-stream')
    const reader = response.body!.getReader()
    const decoder = new TextDecoder()
    let text = ''
    const deadline = Date.now() + 7000
    while (!text.includes(': ping') && Date.now() < deadline) {
      const { value, done } = await reader.read()
      if (done) break
      text += decoder.decode(value)
    }
    await reader.cancel()
    expect(text.startsWith('retry: 3000\n\n')).toBe(true)
    expect(text).toContain(': ping\n\n')
  }, 10_000)

  test('a stream opened afresh is told its place: its client, gone before any event, resumes from there', async () => {
    const user = await signUp(ctx)
    const readUntil = async (reader: { read(): Promise<{ value?: Uint8Array; done: boolean }> }, wanted: RegExp) => {
      const decoder = new TextDecoder()
      let text = ''
      while (!wanted.test(text)) {
        const { value, done } = await reader.read()
        if (done) break
        text += decoder.decode(value)
      }
      return text
    }
    const first = (await rawStream('/v1/events/chat')).body!.getReader()
    const opening = await readUntil(first, /\nid: [^\n]+\n\n/)
    // After its retry, an id and no event: a browser's EventSource keeps it as its last event id.
    const place = /^retry: 3000\n\nid: (\d+-\d+)\n\n/.exec(opening)?.[1]
    expect(place).toBeDefined()
    await first.cancel()
    // Said while the client was away, before it had had any event.
    const said = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'while you were away' } })
    expect(said.status).toBe(201)
    await until(
      async () =>
        (await ctx.deps.redis.xlen(ctx.deps.keys.events.chat)) > 0 &&
        (await ctx.deps.redis.xrevrange(ctx.deps.keys.events.chat, '+', '-', 'COUNT', 1))[0]![0] !== place,
    )
    const resumed = (await rawStream('/v1/events/chat', { 'last-event-id': place! })).body!.getReader()
    expect(await readUntil(resumed, /while you were away/)).toContain(`"id":"${said.body.data.id}"`)
    await resumed.cancel()
    // The place in the query, beside an empty header (a hand-made client's): the query's is taken.
    const byQuery = (await rawStream(`/v1/events/chat?lastEventId=${place}`, { 'last-event-id': '' })).body!.getReader()
    expect(await readUntil(byQuery, /while you were away/)).toContain(`"id":"${said.body.data.id}"`)
    await byQuery.cancel()
  })

  test('an SSE token opens one stream, fails on a second use and after 60 s, and is no bearer anywhere else', async () => {
    const user = await signUp(ctx)
    const issue = async () => (await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })).body.data.token as string
    const token = await issue()
    const opened = await rawStream(`/v1/events/stream?token=${token}`)
    expect(opened.status).toBe(200)
    await opened.body!.cancel()
    const second = await rawStream(`/v1/events/stream?token=${token}`)
    expect(second.status).toBe(401)
    expect(((await second.json()) as { error: string }).error).toBe('invalid_token')
    const late = await issue()
    ctx.clock.advance(61_000)
    const expired = await rawStream(`/v1/events/stream?token=${late}`)
    ctx.clock.set(new Date())
    expect(expired.status).toBe(401)
    // A bad cursor is refused before the token is spent: the same token then opens the stream.
    const retried = await issue()
    const badCursor = await rawStream(`/v1/events/stream?token=${retried}&lastEventId=yesterday`)
    expect(badCursor.status).toBe(400)
    expect(((await badCursor.json()) as { error: string }).error).toBe('invalid_cursor')
    const fixed = await rawStream(`/v1/events/stream?token=${retried}`)
    expect(fixed.status).toBe(200)
    await fixed.body!.cancel()
    const unused = await issue()
    expectError(await ctx.call('GET', '/v1/auth/me', { token: unused }), 401, 'invalid_token')
    expectError(await ctx.call('GET', `/v1/auth/me?token=${unused}`), 401, 'unauthorized')
    expect((await rawStream(`/v1/events/stream?token=${unused}`)).status).toBe(200)
  })

  test('HEAD answers as GET would, and neither spends a token nor holds a stream’s place', async () => {
    const user = await signUp(ctx)
    const head = (path: string, headers: Record<string, string> = {}) => fetch(`${server.url}${path}`, { method: 'HEAD', headers })
    const token = (await ctx.call('POST', '/v1/auth/sse-token', { token: user.token })).body.data.token as string
    const looked = await head(`/v1/events/stream?token=${token}`)
    expect(looked.status).toBe(200)
    expect(looked.headers.get('content-type')).toStartWith('text/event-stream')
    expect((await head(`/v1/events/stream?token=${randomUUID()}`)).status).toBe(401)
    // More HEADs than a user may hold streams, then every place is still free.
    for (let i = 0; i <= maxStreamsPerUser; i++) expect((await head('/v1/events/stream', { authorization: `Bearer ${user.token}` })).status).toBe(200)
    for (let i = 0; i <= maxStreamsPerUser; i++) expect((await head('/v1/events/chat')).status).toBe(200)
    const opened: Response[] = [await rawStream(`/v1/events/stream?token=${token}`)]
    for (let i = 1; i < maxStreamsPerUser; i++) opened.push(await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` }))
    expect(opened.map(res => res.status)).toEqual(opened.map(() => 200))
    for (const res of opened) await res.body!.cancel()
  })

  test(`at most ${maxStreamsPerUser} open notification streams per user; a closed one frees its place`, async () => {
    const user = await signUp(ctx)
    const open: Response[] = []
    for (let i = 0; i < maxStreamsPerUser; i++) {
      const res = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
      expect(res.status).toBe(200)
      open.push(res)
    }
    const refused = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    expect(refused.status).toBe(429)
    expect(((await refused.json()) as { error: string }).error).toBe('rate_limited')
    await open.pop()!.body!.cancel()
    await Bun.sleep(200)
    const again = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    expect(again.status).toBe(200)
    await again.body!.cancel()
    for (const res of open) await res.body!.cancel()
  })

  test('the set of a user’s open streams is kept alive by their heartbeats, not only by the last opening', async () => {
    const user = await signUp(ctx)
    const res = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    expect(res.status).toBe(200)
    try {
      const key = ctx.deps.keys.events.openStreams(user.id)
      // As a minute after the last opening: expired under an open stream, the set would admit five more.
      await ctx.deps.redis.pexpire(key, 1500)
      await until(async () => (await ctx.deps.redis.pttl(key)) > 10_000, 8000)
    } finally {
      await res.body!.cancel()
    }
  }, 15_000)

  test('at most CHAT_STREAMS_PER_ADDRESS world-chat streams per client address; a closed one frees its place', async () => {
    // A real listener behind a trusted proxy (this test), so each forwarded address is a client of its own.
    const own = await createTestContext({ env: { CHAT_STREAMS_PER_ADDRESS: '20', TRUSTED_PROXIES: '127.0.0.1' } })
    const server = own.app.listen({ port: 0, hostname: '127.0.0.1' })
    const max = own.config.chatStreamsPerAddress
    try {
      const chat = (address: string) => fetch(`http://127.0.0.1:${server.server!.port}/v1/events/chat`, { headers: { 'x-forwarded-for': address } })
      const open = await Promise.all(Array.from({ length: max }, () => chat('203.0.113.5')))
      expect(open.map(res => res.status)).toEqual(open.map(() => 200))
      const refused = await chat('203.0.113.5')
      expect(refused.status).toBe(429)
      expect(((await refused.json()) as { error: string }).error).toBe('rate_limited')
      expect(refused.headers.get('retry-after')).toBe('5')
      // Another client, behind the same proxy, has places of its own.
      const other = await chat('203.0.113.6')
      expect(other.status).toBe(200)
      open.push(other)
      await open.shift()!.body!.cancel()
      await until(async () => {
        const again = await chat('203.0.113.5')
        if (again.status === 200) open.push(again)
        else await again.body?.cancel()
        return again.status === 200
      }, 5000)
      for (const res of open) await res.body!.cancel()
    } finally {
      await server.stop()
      await own.close()
    }
  }, 30_000)

  test('credentials: none is 401, an agent key is 403, a bad last event id is 400', async () => {
    const { agent, owner } = await ownerWithPlan()
    expect((await rawStream('/v1/events/stream')).status).toBe(401)
    expect((await rawStream('/v1/events/stream', { 'x-api-key': agent.apiKey, authorization: `Bearer ${agent.apiKey}` })).status).toBe(403)
    // Credentials first: without any, a bad cursor is still 401.
    expect((await rawStream('/v1/events/stream?lastEventId=yesterday')).status).toBe(401)
    const bad = await rawStream('/v1/events/stream?lastEventId=yesterday', { authorization: `Bearer ${owner.token}` })
    expect(bad.status).toBe(400)
    expect(((await bad.json()) as { error: string }).error).toBe('invalid_cursor')
    // One from years ahead would hold the stream silent until then.
    const ahead = await rawStream('/v1/events/stream?lastEventId=9999999999999999-0', { authorization: `Bearer ${owner.token}` })
    expect(ahead.status).toBe(400)
    expect(((await ahead.json()) as { error: string }).error).toBe('invalid_cursor')
    expect((await rawStream('/v1/events/chat?lastEventId=9999999999999999-0')).status).toBe(400)
  })

  test('revoking the API key a stream was opened with ends that stream at once; a stream opened with a JWT goes on', async () => {
    const user = await signUp(ctx)
    const created = await ctx.call('POST', '/v1/auth/api-keys', { token: user.token, body: { name: 'watcher' } })
    const key: string = created.body.data.key
    const viaKey = await rawStream('/v1/events/stream', { authorization: `Bearer ${key}` })
    const token = (await ctx.call('POST', '/v1/auth/sse-token', { token: key })).body.data.token
    const viaToken = await rawStream(`/v1/events/stream?token=${token}`)
    const lateToken = (await ctx.call('POST', '/v1/auth/sse-token', { token: key })).body.data.token
    const viaJwt = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    const readers = [viaKey, viaToken, viaJwt].map(response => response.body!.getReader())
    for (const reader of readers) await reader.read()

    expect((await ctx.call('DELETE', `/v1/auth/api-keys/${created.body.data.id}`, { token: user.token })).status).toBe(200)
    for (const reader of readers.slice(0, 2)) {
      let done = false
      const deadline = Date.now() + 3000
      while (!done && Date.now() < deadline) done = (await reader.read()).done
      expect(done).toBe(true)
    }
    // A stream token asked for with the key before it was revoked opens nothing after; a HEAD says so as GET does.
    const lateHead = await fetch(`${server.url}/v1/events/stream?token=${lateToken}`, { method: 'HEAD' })
    expect(lateHead.status).toBe(401)
    const late = await rawStream(`/v1/events/stream?token=${lateToken}`)
    expect(late.status).toBe(401)
    expect(((await late.json()) as { error: string }).error).toBe('invalid_token')
    // The JWT's stream still delivers.
    await enqueueEvents(ctx.deps.sql, new Date(), [{ userId: user.id, type: 'usage.threshold', payload: { percent: 80 } }])
    let text = ''
    const decoder = new TextDecoder()
    while (!text.includes('event: usage.threshold')) {
      const { value, done } = await readers[2]!.read()
      expect(done).toBe(false)
      text += decoder.decode(value)
    }
    await readers[2]!.cancel()
  })

  test('closing all streams (shutdown) ends them so clients reconnect elsewhere', async () => {
    const user = await signUp(ctx)
    const response = await rawStream('/v1/events/stream', { authorization: `Bearer ${user.token}` })
    const reader = response.body!.getReader()
    await reader.read()
    ctx.deps.events.closeAll()
    let done = false
    const deadline = Date.now() + 3000
    while (!done && Date.now() < deadline) done = (await reader.read()).done
    expect(done).toBe(true)
  })

  test('a stream still being opened when all are closed (shutdown) ends as it opens, after its retry', async () => {
    const opening = ctx.deps.events.open({ stream: ctx.deps.keys.events.chat })
    ctx.deps.events.closeAll()
    const response = await opening
    expect(response.status).toBe(200)
    expect(await response.text()).toMatch(/^retry: 3000\n\nid: \d+-\d+\n\n$/)
    // Streams opened after it are not affected.
    const later = await ctx.deps.events.open({ stream: ctx.deps.keys.events.chat })
    const reader = later.body!.getReader()
    expect((await reader.read()).done).toBe(false)
    await reader.cancel()
  })

  test('a stream refused or ended leaves its connection to the idle timeout again; an open one is kept', async () => {
    // A real listener (the stream lifts the idle timeout through it), as main.ts starts it: idle after a second.
    const own = await createTestContext({ env: { CHAT_STREAMS_PER_ADDRESS: '1', HTTP_IDLE_TIMEOUT_S: '1' } })
    const listener = own.app.listen({ port: 0, hostname: '127.0.0.1', idleTimeout: own.config.httpIdleTimeoutS })
    const sockets: Socket[] = []
    /** One keep-alive connection sending `path`: what came back, and whether the server closed it. */
    const ask = (path: string) => {
      const state = { text: '', closed: false, socket: connect(listener.server!.port!, '127.0.0.1') }
      sockets.push(state.socket)
      state.socket.on('connect', () => state.socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`))
      state.socket.on('data', chunk => (state.text += chunk))
      state.socket.on('close', () => (state.closed = true))
      return state
    }
    try {
      const held = ask('/v1/events/chat')
      await until(async () => held.text.includes('retry: 3000'))
      const refused = ask('/v1/events/chat')
      const badCursor = ask('/v1/events/chat?lastEventId=yesterday')
      await until(async () => refused.text.includes('\r\n\r\n') && badCursor.text.includes('\r\n\r\n'))
      expect(refused.text).toStartWith('HTTP/1.1 429')
      expect(badCursor.text).toStartWith('HTTP/1.1 400')
      await until(async () => refused.closed && badCursor.closed, 15_000)
      // The open stream outlived their idle timeout; ended by the server, its connection goes idle.
      expect(held.closed).toBe(false)
      own.deps.events.closeAll()
      await until(async () => held.closed, 15_000)
    } finally {
      for (const socket of sockets) socket.destroy()
      await listener.stop()
      await own.close()
    }
  }, 40_000)
})

describe('world chat', () => {
  test('users and agents post, everyone watches the public stream, history is newest first, no email shown', async () => {
    const user: TestUser = await signUp(ctx)
    const { agent } = await ownerWithPlan()
    const stream = listen(`${server.url}/v1/events/chat`)
    await Bun.sleep(100)
    const fromUser = await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'hi all' } })
    expect(fromUser.status).toBe(201)
    expect(fromUser.body.data.author).toEqual({ kind: 'user', id: user.id, name: `user-${user.id.slice(0, 8)}` })
    const fromAgent = await ctx.call('POST', '/v1/chat/messages', { apiKey: agent.apiKey, body: { text: 'beep' } })
    expect(fromAgent.body.data.author).toEqual({ kind: 'agent', id: agent.id, name: agent.name })
    const events = await stream.waitFor(2)
    stream.close()
    expect(events.map(e => e.data.text)).toEqual(['hi all', 'beep'])
    // The event's data is the message as posted, with the event's type.
    expect(events[0]!.data).toEqual({ type: 'chat.message', ...fromUser.body.data })
    expect(JSON.stringify(events)).not.toContain('@example.com')
    const history = await ctx.call('GET', '/v1/chat/messages?limit=2', { token: user.token })
    expect(history.body.data.map((m: { text: string }) => m.text)).toEqual(['beep', 'hi all'])
    expect(JSON.stringify(history.body)).not.toContain('@example.com')
    expectError(await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: '' } }), 400, 'validation_failed')
    expectError(await ctx.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'x'.repeat(501) } }), 400, 'validation_failed')
    expectError(await ctx.call('POST', '/v1/chat/messages', { body: { text: 'anon' } }), 401, 'unauthorized')
  })

  test('messages sent in one millisecond get times of their own, so paging with before skips none', async () => {
    const authors = await Promise.all(Array.from({ length: 4 }, () => signUp(ctx)))
    ctx.clock.freeze(new Date())
    try {
      // Forty at once, all at the same clock time.
      const sent = await Promise.all(
        Array.from({ length: 40 }, (_, i) => ctx.call('POST', '/v1/chat/messages', { token: authors[i % 4]!.token, body: { text: `same ms ${i}` } })),
      )
      expect(sent.map(s => s.status)).toEqual(Array(40).fill(201))
      const times = sent.map(s => s.body.data.createdAt as string)
      expect(new Set(times).size).toBe(40)
      // Walked back by pages of 7 from the newest, every one of them is found, once.
      const oldest = [...times].sort()[0]!
      const seen: string[] = []
      let before = ''
      for (let page = 0; page < 20; page++) {
        const res = await ctx.call('GET', `/v1/chat/messages?limit=7${before}`, { token: authors[0]!.token })
        const messages = res.body.data as { id: string; createdAt: string }[]
        seen.push(...messages.map(m => m.id))
        const last = messages.at(-1)
        if (!last || last.createdAt <= oldest) break
        before = `&before=${encodeURIComponent(last.createdAt)}`
      }
      const ids = sent.map(s => s.body.data.id as string)
      expect(seen.filter(id => ids.includes(id)).sort()).toEqual([...ids].sort())
    } finally {
      ctx.clock.set(new Date())
    }
  })

  test('ten messages a minute per author, then 429 with Retry-After', async () => {
    const limited = await createTestContext({
      database: ctx.database,
      env: { REDIS_PREFIX: ctx.config.redisPrefix, RATE_LIMITS: JSON.stringify({ chatPost: { capacity: 10, perSeconds: 60 } }) },
    })
    try {
      const user = await signUp(limited)
      for (let i = 0; i < 9; i++)
        expect((await limited.call('POST', '/v1/chat/messages', { token: user.token, body: { text: `m${i}` } })).status).toBe(201)
      const keyed = { token: user.token, headers: { 'idempotency-key': randomUUID() }, body: { text: 'm9' } }
      const last = await limited.call('POST', '/v1/chat/messages', keyed)
      expect(last.status).toBe(201)
      const refused = expectError(
        await limited.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'one too many' } }),
        429,
        'rate_limited',
      )
      expect(refused).toBeTruthy()
      // Refused, they leave the chat's clock row alone: a flood of them neither queues on it nor runs it ahead.
      const clockAt = async () => (await limited.deps.sql<{ at: Date }[]>`select last_at as at from chat_clock`)[0]!.at.getTime()
      const before = await clockAt()
      const flood = await Promise.all(
        Array.from({ length: 5 }, () => limited.call('POST', '/v1/chat/messages', { token: user.token, body: { text: 'flood' } })),
      )
      expect(flood.map(r => r.status)).toEqual(Array(5).fill(429))
      expect(await clockAt()).toBe(before)
      // The tenth sent again under its key (its reply lost) is its first answer, bucket empty or not.
      const replayed = await limited.call('POST', '/v1/chat/messages', keyed)
      expect(replayed.status).toBe(201)
      expect(replayed.body).toEqual(last.body)
    } finally {
      await limited.close()
    }
  })
})

describe('a process whose subscriber reconnects', () => {
  /** A hub of its own, on a subscriber the test drops and brings back; `publish(n)` relays one event to `stream`. */
  async function hubWithOwnSubscriber(redis: Redis = ctx.deps.redis) {
    const subscriber = createRedis(ctx.config.redisUrl, ctx.deps.log, 'subscriber')
    await subscriber.connect()
    const pubsub = createPubSub(subscriber)
    const hub = await createEventHub({ redis, pubsub, keys: ctx.deps.keys, log: ctx.deps.log })
    const user = randomUUID()
    const stream = ctx.deps.keys.events.user(user)
    const publish = async (n: number) => {
      await enqueueEvents(ctx.deps.sql, new Date(), [{ userId: user, type: 'usage.threshold', payload: { n } }])
      await until(async () => (await ctx.deps.sql`select 1 from outbox where user_id = ${user}`).length === 0)
    }
    /** Drops the subscription (as Redis does when it kills the connection) until `back()`: what is published meanwhile reaches nobody here. */
    const drop = () => {
      subscriber.disconnect()
      return {
        async back() {
          const ready = new Promise(resolve => subscriber.once('ready', resolve))
          await subscriber.connect()
          await ready
        },
      }
    }
    return {
      hub,
      pubsub,
      stream,
      publish,
      drop,
      async close() {
        await hub.close()
        await pubsub.close()
      },
    }
  }

  /** The service's Redis, with its stream reads' answers held back from `hold()` until `release()`. */
  function heldReads() {
    let gate: Promise<void> | undefined
    let open = () => {}
    let reads = 0
    const redis = new Proxy(ctx.deps.redis, {
      get(target, name) {
        if (name === 'xrevrange') {
          return async (...args: unknown[]) => {
            const answer = await (target.xrevrange as (...a: unknown[]) => Promise<unknown>)(...args)
            reads++
            await gate
            return answer
          }
        }
        const value = Reflect.get(target, name, target)
        return typeof value === 'function' ? value.bind(target) : value
      },
    })
    return {
      redis,
      /** How many reads were answered (held or not). */
      reads: () => reads,
      hold: () => void (gate = new Promise(resolve => (open = resolve))),
      release() {
        gate = undefined
        open()
      },
    }
  }

  /**
   * A hub of its own whose stream reads pass `held` (heldReads), with a live stream that has had
   * event 1 (`id` is its id); `resumeHeld()` opens a client's resume from 1 and returns once Redis
   * has answered its read, the answer held: `opening` is the stream, open once `held.release()`.
   */
  async function liveAfterOne() {
    const held = heldReads()
    const world = await hubWithOwnSubscriber(held.redis)
    const live = (await world.hub.open({ stream: world.stream })).body!.getReader()
    await world.publish(1)
    expect(await readEvents(live, 1)).toEqual({ ns: [1], ended: false })
    const id = ((await ctx.deps.redis.xrevrange(world.stream, '+', '-', 'COUNT', 1)) as [string, string[]][])[0]![0]
    const resumeHeld = async () => {
      held.hold()
      const readsBefore = held.reads()
      const opening = world.hub.open({ stream: world.stream, lastEventId: id })
      await until(async () => held.reads() > readsBefore)
      return { opening }
    }
    return { ...world, held, live, id, resumeHeld }
  }

  const decoder = new TextDecoder()
  /** Reads a stream until it has `count` events (or ends): the n of each, and whether it ended. */
  const readEvents = async (reader: { read(): Promise<{ value?: Uint8Array; done: boolean }> }, count: number) => {
    let text = ''
    const ns = () => [...text.matchAll(/"n":(\d+)/g)].map(m => Number(m[1]))
    while (ns().length < count) {
      const { value, done } = await reader.read()
      if (done) return { ns: ns(), ended: true }
      text += decoder.decode(value)
    }
    return { ns: ns(), ended: false }
  }

  test('an open stream goes on and gets what was published meanwhile, once, in order', async () => {
    const { hub, stream, publish, drop, close } = await hubWithOwnSubscriber()
    const reader = (await hub.open({ stream })).body!.getReader()
    await publish(1)
    expect(await readEvents(reader, 1)).toEqual({ ns: [1], ended: false })
    const dropped = drop()
    await publish(2)
    await publish(3)
    await dropped.back()
    await publish(4)
    expect(await readEvents(reader, 3)).toEqual({ ns: [2, 3, 4], ended: false })
    await reader.cancel()
    await close()
  })

  test('a stream that had received nothing yet gets what was published meanwhile too (its client has no id to resume from)', async () => {
    const { hub, stream, publish, drop, close } = await hubWithOwnSubscriber()
    await publish(0)
    const reader = (await hub.open({ stream })).body!.getReader()
    const dropped = drop()
    await publish(1)
    await publish(2)
    await dropped.back()
    await publish(3)
    // Nothing from before it opened (0), everything after.
    expect(await readEvents(reader, 3)).toEqual({ ns: [1, 2, 3], ended: false })
    await reader.cancel()
    await close()
  })

  test('a drop during a catch-up: the catch-up reads again before it goes live, so nothing missed meanwhile is skipped', async () => {
    const held = heldReads()
    const { hub, stream, publish, drop, close } = await hubWithOwnSubscriber(held.redis)
    const reader = (await hub.open({ stream })).body!.getReader()
    await publish(1)
    expect(await readEvents(reader, 1)).toEqual({ ns: [1], ended: false })
    held.hold()
    const first = drop()
    await publish(2)
    // Back: the catch-up reads 2, its answer held.
    const readsBefore = held.reads()
    await first.back()
    await until(async () => held.reads() > readsBefore)
    // Dropped again while it reads: 3 reaches nobody here; 4 comes live, after the gap.
    const second = drop()
    await publish(3)
    await second.back()
    await publish(4)
    held.release()
    expect(await readEvents(reader, 3)).toEqual({ ns: [2, 3, 4], ended: false })
    await reader.cancel()
    await close()
  })

  test('a subscriber whose first PING after reconnecting goes unanswered past its timeout, on a connection that stays, listens again', async () => {
    // Redis slow for a moment (3.3 s: past the command timeout, within the probe's wait) as the
    // subscriber comes back. Unfixed, the PING's failure was taken for the connection gone again,
    // which it was not: no reconnect came, and the process stayed deaf to live events for good.
    const proxy = await startHeldProxy(redisUrl)
    const subscriber = createRedis(proxy.url, ctx.deps.log, 'subscriber')
    await subscriber.connect()
    const pubsub = createPubSub(subscriber)
    const hub = await createEventHub({ redis: ctx.deps.redis, pubsub, keys: ctx.deps.keys, log: ctx.deps.log })
    const user = randomUUID()
    const stream = ctx.deps.keys.events.user(user)
    try {
      // Before any stream opens, the subscriber listens on nothing: no SUBSCRIBE goes out again with it.
      const ended = new Promise(resolve => subscriber.once('end', resolve))
      subscriber.disconnect()
      await ended
      // Held from the 'ready' on, before pub/sub's PING (sent on the next turn) leaves.
      subscriber.once('ready', () => proxy.hold())
      await subscriber.connect()
      await Bun.sleep(3300)
      proxy.release()
      await until(async () => pubsub.listening(), 10_000)
      const reader = (await hub.open({ stream })).body!.getReader()
      await enqueueEvents(ctx.deps.sql, new Date(), [{ userId: user, type: 'usage.threshold', payload: { n: 1 } }])
      expect(await readEvents(reader, 1)).toEqual({ ns: [1], ended: false })
      await reader.cancel()
    } finally {
      proxy.release()
      await hub.close()
      await pubsub.close()
      await proxy.close()
    }
  })

  test('a catch-up after a drop shares no read begun before the drop: a resume reading then does not hide what was missed', async () => {
    const { pubsub, publish, drop, close, held, live, resumeHeld } = await liveAfterOne()
    // A client resumes from 1, the live stream's place too: its read (after 1, nothing yet) is held.
    const { opening: resuming } = await resumeHeld()
    // The subscription drops; 2 reaches nobody here; back, the live stream catches up from 1.
    const reconnected = new Promise<void>(resolve => pubsub.onReconnect(resolve))
    const dropped = drop()
    await publish(2)
    await dropped.back()
    await reconnected
    held.release()
    const resumed = (await resuming).body!.getReader()
    await publish(3)
    await publish(4)
    // The first two it gets after 1: 3 and 4 when it skipped 2.
    expect(await readEvents(live, 2)).toEqual({ ns: [2, 3], ended: false })
    expect(await readEvents(resumed, 3)).toEqual({ ns: [2, 3, 4], ended: false })
    await live.cancel()
    await resumed.cancel()
    await close()
  })

  test('a resume shares no read sent before it listened: what came live in between is not lost to it', async () => {
    const { hub, stream, publish, close, held, live, id, resumeHeld } = await liveAfterOne()
    // A first client resumes from 1: its read (nothing after 1 yet) is answered by Redis, the answer held.
    const { opening: first } = await resumeHeld()
    // 2 comes live (the live stream has it, so every stream here open then has been handed it)...
    await publish(2)
    expect(await readEvents(live, 1)).toEqual({ ns: [2], ended: false })
    // ...before a second client resumes from 1 too: the read sent before it listened has no 2.
    const second = hub.open({ stream, lastEventId: id })
    await until(async () => hub.size === 3)
    held.release()
    const [a, b] = [(await first).body!.getReader(), (await second).body!.getReader()]
    await publish(3)
    expect(await readEvents(a, 2)).toEqual({ ns: [2, 3], ended: false })
    // The first it gets after 1: 3 when it skipped 2.
    expect(await readEvents(b, 1)).toEqual({ ns: [2], ended: false })
    for (const reader of [live, a, b]) await reader.cancel()
    await close()
  })
})
