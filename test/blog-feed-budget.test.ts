/** What one anonymous request for a post or a feed makes the service read and write: HTML up to a bound, whatever the posts. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { XMLParser, XMLValidator } from 'fast-xml-parser'
import { createTestContext, expectError, signUp, type TestAgent, type TestContext } from './helpers/context.ts'
import { blogAgent, writePost } from './helpers/blog.ts'
import { feedHtmlBytes } from '../src/blog/rss.ts'
import { maxHtmlBytes } from '../src/blog/markdown.ts'

let ctx: TestContext
let agent: TestAgent
/** Published posts' urls, newest first. */
const urls: string[] = []
let newestHtml = ''

beforeAll(async () => {
  ctx = await createTestContext()
  agent = await blogAgent(ctx, await signUp(ctx))
  // Each post's HTML is 400,000 bytes (every `<` written `&lt;`), 800,000 once escaped for XML.
  for (let i = 0; i < 8; i++) {
    ctx.clock.advance(1000)
    // The oldest has no excerpt: its description is the start of its text (as HTML).
    const excerpt = i === 0 ? {} : { excerpt: `Excerpt ${i}` }
    const post = await writePost(ctx, agent, { title: `Wide ${i}`, content: '<'.repeat(100_000), ...excerpt, publish: true })
    urls.unshift(post.url)
  }
  const [row] = await ctx.deps.sql<
    { html: string }[]
  >`select content_html as html from blog_posts where participant_id = ${agent.id} order by published_at desc limit 1`
  newestHtml = row!.html
})
afterAll(() => ctx.close())

const parser = new XMLParser({ ignoreAttributes: false, htmlEntities: true })

describe('a feed of posts whose HTML passes the budget', () => {
  for (const path of ['/blog/feed.xml', () => `/blog/${agent.name}/rss`]) {
    test(`${typeof path === 'string' ? path : '/blog/{agent}/rss'}: every item listed, the HTML of the newest up to the budget`, async () => {
      const response = await ctx.app.handle(new Request(`http://test.local${typeof path === 'string' ? path : path()}`))
      expect(response.status).toBe(200)
      const xml = await response.text()
      expect(XMLValidator.validate(xml)).toBe(true)
      const items: { link: string; description: string; 'content:encoded'?: string }[] = [parser.parse(xml).rss.channel.item].flat()
      expect(items.map(item => item.link)).toEqual(urls)
      expect(items.map(item => item.description)).toEqual(urls.map((_, i) => (i === 7 ? `${'&lt;'.repeat(299)}…` : `Excerpt ${7 - i}`)))
      expect(items[0]!['content:encoded']).toBe(newestHtml.trim())
      const carried = items.filter(item => item['content:encoded'] !== undefined)
      expect(carried.reduce((sum, item) => sum + Buffer.byteLength(item['content:encoded']!), 0)).toBeLessThanOrEqual(feedHtmlBytes)
      // Newest first: once one is left out, so are the older ones.
      expect(carried.length).toBe(Math.floor(feedHtmlBytes / Buffer.byteLength(newestHtml)))
      expect(items.slice(0, carried.length)).toEqual(carried)
    })
  }
})

describe('a post whose HTML would pass its bound', () => {
  // 100,000 characters that render to 33 MB: one long reference, used 16,000 times.
  const definition = `[r]: http://example.com/${'a'.repeat(2000)}\n\n`
  const amplified = definition + '[a][r]'.repeat(Math.floor((100_000 - definition.length) / 6))

  test('is refused as written or edited, and nothing is kept; a text that only grows as escaped is taken', async () => {
    const refused = await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Amplified', content: amplified, publish: true } })
    expectError(refused, 400, 'validation_failed')
    expect(refused.body.details[0].path).toBe('/content')
    expect((await ctx.deps.sql`select 1 from blog_posts where title = 'Amplified'`).length).toBe(0)

    // Every `"` is `&quot;` in HTML: six times the size, within the bound.
    const quoted = await writePost(ctx, agent, { title: 'Quoted', content: '"'.repeat(100_000) })
    const edit = await ctx.call('PATCH', `/blog/posts/${quoted.id}`, { apiKey: agent.apiKey, body: { content: amplified } })
    expectError(edit, 400, 'validation_failed')
    const [row] = await ctx.deps.sql<{ content: string; bytes: number }[]>`
      select content, octet_length(content_html) as bytes from blog_posts where id = ${quoted.id}
    `
    expect(row!.content).toBe('"'.repeat(100_000))
    expect(row!.bytes).toBeLessThanOrEqual(maxHtmlBytes)
  })
})
