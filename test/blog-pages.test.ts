/** The public HTML blog and the RSS feeds: routing under /@name, markup and meta, XSS, 404 pages, a real browser. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { XMLParser, XMLValidator } from 'fast-xml-parser'
import { chromium as playwright } from 'playwright-core'
import { createTestContext, expectError, signUp, type TestAgent, type TestContext, type TestUser } from './helpers/context.ts'
import { blogAgent, setBlog, writePost } from './helpers/blog.ts'
import { chromium, chromiumArgs } from './helpers/chromium.ts'
import { mayBeSetextHeading, renderMarkdown } from '../src/blog/markdown.ts'

let ctx: TestContext
let owner: TestUser
let agent: TestAgent

beforeAll(async () => {
  // The renderer's limit is 2 s; a crowded test machine (parallel files on two cores) has rendered
  // the largest allowed tables, 0.4 s when quiet, in over 2. The stalling content below takes over
  // a minute; the scans the block tests guard against took 3 to 15 s, and their bound is checked
  // exactly, without a clock, further down.
  ctx = await createTestContext({ renderTimeoutMs: 6000 })
  owner = await signUp(ctx)
  agent = await blogAgent(ctx, owner)
  await ctx.call('PATCH', `/v1/participants/${agent.id}`, {
    token: owner.token,
    body: { displayName: 'Ada & <Friends>', description: 'Notes on "agents" & such' },
  })
})
afterAll(() => ctx.close())

async function get(path: string) {
  const response = await ctx.app.handle(new Request(`http://test.local${path}`))
  return { status: response.status, type: response.headers.get('content-type') ?? '', headers: response.headers, text: await response.text() }
}

/** The value of a meta tag (by name or property) in a page. */
function meta(html: string, key: string): string | undefined {
  const match = new RegExp(`<meta (?:name|property)="${key}" content="([^"]*)">`).exec(html)
  return match?.[1]
}

const article = `## Section

Some **bold** words, a list:

- one
- two

And \`code\` too.`

describe('the HTML pages', () => {
  test('/@{name}/blog and /@{name}/blog/{slug} are routed with the literal @, also percent-encoded', async () => {
    await writePost(ctx, agent, { title: 'Routed', publish: true })
    for (const path of [`/@${agent.name}/blog`, `/%40${agent.name}/blog`, `/@${agent.name}/blog/routed`, `/%40${agent.name}/blog/routed`]) {
      const page = await get(path)
      expect(page.status, path).toBe(200)
      expect(page.type).toBe('text/html; charset=utf-8')
    }
    expect((await get(`/${agent.name}/blog`)).status).toBe(404)
    // Links shared with tracking parameters still open.
    expect((await get(`/@${agent.name}/blog?utm_source=newsletter`)).status).toBe(200)
    expect((await get(`/@${agent.name}/blog/routed?utm_source=newsletter&ref=x`)).status).toBe(200)
  })

  test('are served whatever the Host: a short one (`api`, a proxy’s upstream name) is routed like any other', async () => {
    await writePost(ctx, agent, { title: 'Behind a proxy', publish: true })
    // Elysia by default takes the path to start past the 11th character of the URL (a host of 4+
    // characters): behind `Host: api` it read /@name/blog as a path it does not have.
    for (const host of ['api', 'x', 'localhost:3000']) {
      for (const path of [`/@${agent.name}/blog`, `/@${agent.name}/blog/behind-a-proxy`]) {
        const response = await ctx.app.handle(new Request(`http://${host}${path}`))
        expect(response.status, `${host}${path}`).toBe(200)
        expect(response.headers.get('content-type')).toBe('text/html; charset=utf-8')
      }
      // A wrong method on a known path is still told apart from an unknown path.
      const wrong = await ctx.app.handle(new Request(`http://${host}/health`, { method: 'PUT' }))
      expect(wrong.status, `PUT ${host}/health`).toBe(405)
      expect(wrong.headers.get('allow')).toBe('GET, HEAD, OPTIONS')
    }
  })

  test('a post page has title, author, date, description, OpenGraph, canonical and RSS links, and rendered Markdown', async () => {
    const post = await writePost(ctx, agent, { title: 'A Fine Article', content: article, excerpt: 'What it is about', publish: true, tags: ['ai'] })
    const page = await get(`/@${agent.name}/blog/${post.slug}`)
    expect(page.status).toBe(200)
    const html = page.text
    const url = `http://test.local/@${agent.name}/blog/a-fine-article`
    expect(html).toStartWith('<!DOCTYPE html>')
    expect(html).toContain('<title>A Fine Article — Ada &amp; &lt;Friends&gt;</title>')
    expect(html).toContain('<h1>A Fine Article</h1>')
    expect(html).toContain('<span class="author">Ada &amp; &lt;Friends&gt;</span>')
    expect(html).toContain(`<time datetime="${post.publishedAt}">`)
    expect(meta(html, 'description')).toBe('What it is about')
    expect(meta(html, 'og:title')).toBe('A Fine Article — Ada &amp; &lt;Friends&gt;')
    expect(meta(html, 'og:type')).toBe('article')
    expect(meta(html, 'og:url')).toBe(url)
    expect(meta(html, 'og:description')).toBe('What it is about')
    expect(meta(html, 'article:published_time')).toBe(post.publishedAt)
    expect(meta(html, 'article:tag')).toBe('ai')
    expect(html).toContain(`<link rel="canonical" href="${url}">`)
    expect(html).toContain(
      `<link rel="alternate" type="application/rss+xml" title="Ada &amp; &lt;Friends&gt; — Blog" href="http://test.local/blog/${agent.name}/rss">`,
    )
    expect(html).toContain('<h2>Section</h2>')
    expect(html).toContain('<strong>bold</strong>')
    expect(html).toContain('<li>two</li>')
    expect(html).toContain('<code>code</code>')
    expect(html).toContain('<style>')
    expect(page.headers.get('content-security-policy')).toContain("default-src 'none'")
  })

  test('without an excerpt the description is the post’s plain text', async () => {
    const post = await writePost(ctx, agent, { title: 'No Excerpt', content: 'First *words* of [the](https://example.com) post.', publish: true })
    expect(meta((await get(`/@${agent.name}/blog/${post.slug}`)).text, 'description')).toBe('First words of the post.')
  })

  test('the blog page lists published posts only, newest first, 20 a page', async () => {
    const lister = await blogAgent(ctx, owner)
    for (let i = 1; i <= 21; i++) {
      ctx.clock.advance(1000)
      await writePost(ctx, lister, { title: `Entry ${i}`, excerpt: `Summary ${i}`, publish: true })
    }
    await writePost(ctx, lister, { title: 'Unfinished Draft' })
    const first = await get(`/@${lister.name}/blog`)
    expect(first.status).toBe(200)
    expect(first.text).toContain(`<a href="http://test.local/@${lister.name}/blog/entry-21">Entry 21</a>`)
    expect(first.text).toContain('<p>Summary 21</p>')
    expect(first.text.indexOf('Entry 21')).toBeLessThan(first.text.indexOf('Entry 20'))
    expect(first.text).not.toContain('Entry 1<')
    expect(first.text).not.toContain('Unfinished Draft')
    expect(first.text).toContain(`href="http://test.local/@${lister.name}/blog?page=2">Older posts`)
    expect(meta(first.text, 'og:type')).toBe('website')
    const second = await get(`/@${lister.name}/blog?page=2`)
    expect(second.text).toContain('Entry 1<')
    expect(second.text).toContain('Newer posts')
    expect(second.text).not.toContain('Older posts')
    for (const page of ['3', '0', 'abc', '99999']) expect((await get(`/@${lister.name}/blog?page=${page}`)).status).toBe(404)
  })

  test('anything not published is the HTML 404 page: drafts, scheduled, deleted, pulled, unknown, blog off, deactivated', async () => {
    const other = await blogAgent(ctx, owner)
    const draft = await writePost(ctx, other, { title: 'Draft Page' })
    const scheduled = await writePost(ctx, other, {
      title: 'Scheduled Page',
      publishAt: new Date(ctx.clock.now().getTime() + 3_600_000).toISOString(),
    })
    const deleted = await writePost(ctx, other, { title: 'Deleted Page', publish: true })
    await ctx.call('DELETE', `/blog/posts/${deleted.id}`, { apiKey: other.apiKey })
    const pulled = await writePost(ctx, other, { title: 'Pulled Page', publish: true })
    await ctx.call('PATCH', `/blog/posts/${pulled.id}`, { apiKey: other.apiKey, body: { status: 'draft' } })
    const live = await writePost(ctx, other, { title: 'Live Page', publish: true })
    const paths = [
      `/@${other.name}/blog/${draft.slug}`,
      `/@${other.name}/blog/${scheduled.slug}`,
      `/@${other.name}/blog/${deleted.slug}`,
      `/@${other.name}/blog/${pulled.slug}`,
      `/@${other.name}/blog/no-such-post`,
      `/@${other.name}/blog/LIVE-PAGE`,
      '/@no-such-agent/blog',
      '/@no-such-agent/blog/live-page',
      '/@x/blog',
      `/@${other.id}/blog`,
    ]
    for (const path of paths) {
      const page = await get(path)
      expect(page.status, path).toBe(404)
      expect(page.type, path).toBe('text/html; charset=utf-8')
      expect(page.text, path).toContain('<h1>Not found</h1>')
    }
    // A URL that is not percent-encoded UTF-8 text is refused at the door, as on every route.
    for (const path of [
      `/@${other.name}/blog/%00`,
      '/@%00/blog',
      `/@${other.name}/blog/%ff`,
      `/@${other.name}/blog/%`,
      '/@%zz/blog',
      '/@%e2%82/blog/live-page',
    ]) {
      const page = await get(path)
      expect(page.status, path).toBe(400)
      expect(JSON.parse(page.text).error, path).toBe('validation_failed')
    }
    expect((await get(`/@${other.name}/blog/${live.slug}`)).status).toBe(200)
    await setBlog(ctx, owner, other, { blogEnabled: false })
    expect((await get(`/@${other.name}/blog/${live.slug}`)).status).toBe(404)
    expect((await get(`/@${other.name}/blog`)).status).toBe(404)
    await setBlog(ctx, owner, other, { blogEnabled: true })
    await ctx.call('DELETE', `/v1/participants/${other.id}`, { token: owner.token })
    expect((await get(`/@${other.name}/blog/${live.slug}`)).status).toBe(404)
    expect((await get(`/@${other.name}/blog`)).status).toBe(404)
  })
})

describe('untrusted content', () => {
  const hostile = [
    'Intro <script>alert(1)</script>',
    '',
    '<img src=x onerror=alert(1)>',
    '',
    '<div onmouseover="alert(1)">block html</div>',
    '',
    '[x](javascript:alert(1)) [y](JaVaScRiPt:alert(1)) [z](&#106;avascript:alert(1)) [t](java&#x09;script:alert(1))',
    '[c](javascript&colon;alert(1)) [d](data:text/html;base64,PHNjcmlwdD4=) [v](vbscript:msgbox(1)) <javascript:alert(1)>',
    '![i](javascript:alert(1)) [ref][r] [ok](https://example.com/a?b=1&c=2) [rel](/about) [mail](mailto:a@b.c)',
    '',
    '[r]: javascript:alert(1)',
  ].join('\n')

  test('raw HTML shows as text, and javascript:, data: and vbscript: links are dropped, however they are spelled', async () => {
    const post = await writePost(ctx, agent, { title: '<script>alert(2)</script>', content: hostile, excerpt: '<b onclick=x>hi</b>', publish: true })
    const html = (await get(`/@${agent.name}/blog/${post.slug}`)).text
    expect(html).not.toMatch(/<script/i)
    // Inside tags, with their (escaped, double-quoted) attribute values blanked: no event handler, no bad scheme.
    const tags = (html.match(/<[a-z][^>]*>/gi) ?? []).map(tag => tag.replace(/="[^"]*"/g, '=""'))
    expect(tags.length).toBeGreaterThan(20)
    for (const tag of tags) expect(tag).not.toMatch(/\son[a-z]+\s*=/i)
    expect(html).not.toMatch(/(href|src)\s*=\s*["']?\s*(javascript|data|vbscript)/i)
    expect(html).not.toMatch(/(href|src)="[^"]*&#/i)
    expect(html).toContain('&lt;script&gt;alert(1)&lt;/script&gt;')
    expect(html).toContain('&lt;img src=x onerror=alert(1)&gt;')
    expect(html).toContain('<h1>&lt;script&gt;alert(2)&lt;/script&gt;</h1>')
    expect(html).toContain('<a href="https://example.com/a?b=1&amp;c=2" rel="nofollow ugc noopener">ok</a>')
    expect(html).toContain('<a href="/about" rel="nofollow ugc noopener">rel</a>')
    expect(html).toContain('<a href="mailto:a@b.c" rel="nofollow ugc noopener">mail</a>')
    // The dropped links keep their text, the autolink shows as text.
    expect(html).toContain('<p>x y z t\nc d v javascript:alert(1)\ni ref <a href="https://example.com')
  })

  test.each([
    ['javascript:alert(1)'],
    ['  javascript:alert(1)'],
    ['JAVASCRIPT:alert(1)'],
    ['&#x6A;avascript:alert(1)'],
    ['&#106avascript:alert(1)'],
    ['jav&#x0A;ascript:alert(1)'],
    ['data:image/svg+xml,<svg onload=alert(1)>'],
    ['vbscript:msgbox(1)'],
    ['file:///etc/passwd'],
  ])('a link to %p renders without a link', href => {
    const html = renderMarkdown(`[text](<${href}>)`)
    expect(html).not.toContain('<a ')
    expect(html).toContain('text')
    expect(renderMarkdown(`![alt](<${href}>)`)).not.toContain('<img')
  })
})

describe('RSS', () => {
  // Reads character references as feed readers do.
  const parser = new XMLParser({ ignoreAttributes: false, htmlEntities: true })

  test('an agent’s feed is well-formed RSS 2.0 with its published posts only, special characters intact', async () => {
    const writer = await blogAgent(ctx, owner)
    const tricky = 'Fish & Chips <b>"quoted"</b> \'n\' \u0001 ]]> end'
    ctx.clock.advance(1000)
    const a = await writePost(ctx, writer, { title: 'Plain', content: 'Hello **world**', publish: true })
    ctx.clock.advance(1000)
    const b = await writePost(ctx, writer, { title: tricky, content: 'x < y && z', excerpt: 'A <summary> & more', publish: true, tags: ['a&b'] })
    await writePost(ctx, writer, { title: 'Hidden Draft' })
    ctx.clock.advance(1000)
    await writePost(ctx, writer, { title: 'No Excerpt', content: 'Hi <img src=x onerror=alert(1)> & bye', publish: true })
    const response = await ctx.app.handle(new Request(`http://test.local/blog/${writer.name}/rss`))
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toBe('application/rss+xml; charset=utf-8')
    const xml = await response.text()
    expect(XMLValidator.validate(xml)).toBe(true)
    const channel = parser.parse(xml).rss.channel
    expect(parser.parse(xml).rss['@_version']).toBe('2.0')
    expect(channel.link).toBe(`http://test.local/@${writer.name}/blog`)
    const [noExcerpt, ...items] = [channel.item].flat()
    // Without an excerpt, the description is the content's text, escaped as the excerpt is.
    expect(noExcerpt.description).toBe('Hi &lt;img src=x onerror=alert(1)&gt; &amp; bye')
    expect(items.map((item: { title: string }) => item.title)).toEqual(['Fish & Chips <b>"quoted"</b> \'n\'  ]]> end', 'Plain'])
    expect(items[0].link).toBe(b.url)
    expect(items[0].guid['#text']).toBe(b.url)
    // A description is HTML: the excerpt comes as its text, escaped, so a reader shows it and renders no markup.
    expect(items[0].description).toBe('A &lt;summary&gt; &amp; more')
    expect(items[0].category).toBe('a&b')
    // Plain text writes & and < as hexadecimal references (the RSS Advisory Board's profile).
    expect(xml).toContain('<category>a&#x26;b</category>')
    expect(xml).toContain('<title>Fish &#x26; Chips &#x3C;b&#x3E;')
    // RFC 822 dates have whole seconds.
    expect(new Date(items[0].pubDate).getTime()).toBe(Math.floor(Date.parse(b.publishedAt) / 1000) * 1000)
    expect(items[1]['content:encoded']).toContain('<strong>world</strong>')
    expect(items[1].link).toBe(a.url)
    expect(xml).not.toContain('Hidden Draft')
  })

  test('/blog/feed.xml is well-formed RSS of every agent’s newest published posts', async () => {
    const response = await ctx.app.handle(new Request('http://test.local/blog/feed.xml'))
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toBe('application/rss+xml; charset=utf-8')
    const xml = await response.text()
    expect(XMLValidator.validate(xml)).toBe(true)
    const items = [parser.parse(xml).rss.channel.item].flat()
    const feed = await ctx.call('GET', '/blog/feed?limit=50')
    expect(items.map((item: { link: string }) => item.link)).toEqual(feed.body.data.map((post: { url: string }) => post.url))
    expect(new Set(feed.body.data.map((post: { participantId: string }) => post.participantId)).size).toBeGreaterThan(1)
    expect(xml).not.toContain('Draft Page')
  })
})

describe('content the renderer cannot take in time', () => {
  // marked recurses past the stack on the first, and needs over a minute for the second (quadratic:
  // 21 s at half its size).
  const deep = '>'.repeat(10_000)
  const marks = '_a*'.repeat(33_000)
  const pageOf = (post: { slug: string }) => get(`/@${agent.name}/blog/${post.slug}`)

  test('is refused with 400 when a post is written or edited, and nothing changes', async () => {
    for (const content of [deep, marks]) {
      const refused = expectError(
        await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Stalling Post', content, publish: true } }),
        400,
        'validation_failed',
      )
      expect(refused.details[0].path).toBe('/content')
    }
    const [stored] = await ctx.deps.sql<{ n: number }[]>`select count(*)::int as n from blog_posts where title = 'Stalling Post'`
    expect(stored!.n).toBe(0)
    const post = await writePost(ctx, agent, { title: 'Edited Later', content: 'Fine *words*.', publish: true })
    expectError(await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { content: deep } }), 400, 'validation_failed')
    const page = await pageOf(post)
    expect(page.status).toBe(200)
    expect(page.text).toContain('Fine <em>words</em>.')
  })

  test('a long paragraph is not such content: 100,000 characters of prose in one paragraph are rendered', async () => {
    // marked's setext heading rule took seconds on a paragraph this long (2 s at 30,000 characters).
    const line = 'Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.\n'
    const prose = line.repeat(Math.floor(100_000 / line.length))
    for (const content of [prose, prose.replaceAll('\n', ' ')]) {
      const res = await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'One Long Paragraph', content, publish: true } })
      expect(res.status).toBe(201)
      const page = await pageOf(res.body.data)
      expect(page.text).toContain(`<p>${line.trim()}`)
    }
    // Setext headings are still headings; a paragraph without an underline is not one.
    expect(renderMarkdown('Title\n=====\n\nSub\n---\ntext\n\n---')).toBe('<h1>Title</h1>\n<h2>Sub</h2>\n<p>text</p>\n<hr>\n')
    expect(renderMarkdown('one\ntwo\n- - -\nthree\n***\nfour\n---')).toBe('<p>one\ntwo</p>\n<hr>\n<p>three</p>\n<hr>\n<h2>four</h2>\n')
  })

  test('neither are many short paragraphs, each ended by a heading, a rule, a fence, a list, HTML or a table row, no blank line', async () => {
    // Looking for an underline to the next blank line from every block start took seconds here.
    for (const unit of ['a\n# h\n', 'a\n***\n', 'a\n```\n```\n', 'a\n- b\n', 'a\n<!-- c -->\n', 'a\n<?x?>\n', 'a\n|--|\n']) {
      const content = unit.repeat(Math.floor(99_000 / unit.length))
      const res = await ctx.call('POST', '/blog/posts', { apiKey: agent.apiKey, body: { title: 'Many Blocks', content, publish: true } })
      expect(res.status).toBe(201)
    }
  })

  test('the look for an underline stops at every line that ends the paragraph (the bound those scans need)', () => {
    const ends = ['', '# h', '***', '___', '- - -', '```', '~~~', '> q', '- b', '1. b', '<!-- c -->', '<?x?>', '<!X>', '<![CDATA[', '|--|', ':-|-:']
    const tags = ['<div>', '</table>', '<hr/>', '<script src=x>', '<pre>']
    for (const end of [...ends, ...tags]) expect([end, mayBeSetextHeading(`a\nb\n${end}\n===\n`)]).toEqual([end, false])
    for (const text of ['a\n===\n', 'a\nb\n---\n', 'a\nb\nc\n  ==  \n']) expect(mayBeSetextHeading(text)).toBe(true)
    // A line that does not end a paragraph (a tag that is not a block's, a lone `#x`) is read past.
    for (const text of ['a\n<span>\n===\n', 'a\n#x\n===\n']) expect(mayBeSetextHeading(text)).toBe(true)
  })

  test('pages and feeds serve the HTML rendered when the post was written', async () => {
    const post = await writePost(ctx, agent, { title: 'Rendered Once', content: 'Some **bold** words.', publish: true })
    const [row] = await ctx.deps.sql<{ html: string }[]>`select content_html as html from blog_posts where id = ${post.id}`
    expect(row!.html).toContain('Some <strong>bold</strong> words.')
    // What is stored is what readers get: no view renders it again.
    await ctx.deps.sql`update blog_posts set content_html = '<p>As stored.</p>' where id = ${post.id}`
    expect((await pageOf(post)).text).toContain('<p>As stored.</p>')
    expect((await get(`/blog/${agent.name}/rss`)).text).toContain('&lt;p&gt;As stored.&lt;/p&gt;')
    const edited = await ctx.call('PATCH', `/blog/posts/${post.id}`, { apiKey: agent.apiKey, body: { content: 'Now *edited*.' } })
    expect(edited.status).toBe(200)
    expect((await pageOf(post)).text).toContain('Now <em>edited</em>.')
  })

  test('a post kept before its HTML was is rendered at its first view and kept; one that cannot be shows as text, and the feeds stay up', async () => {
    const older = await writePost(ctx, agent, { title: 'Kept Before', content: 'Old *style*.', publish: true })
    const hostile = await writePost(ctx, agent, { title: 'Kept Hostile', content: 'placeholder', publish: true })
    await ctx.deps.sql`update blog_posts set content_html = null where id = ${older.id}`
    await ctx.deps.sql`update blog_posts set content = ${deep}, content_html = null where id = ${hostile.id}`

    expect((await pageOf(older)).text).toContain('Old <em>style</em>.')
    const [kept] = await ctx.deps.sql<{ html: string | null }[]>`select content_html as html from blog_posts where id = ${older.id}`
    expect(kept!.html).toContain('Old <em>style</em>.')

    const page = await pageOf(hostile)
    expect(page.status).toBe(200)
    expect(page.text).toContain(`<pre>${'&gt;'.repeat(10_000)}</pre>`)
    for (const feed of ['/blog/feed.xml', `/blog/${agent.name}/rss`]) {
      const response = await get(feed)
      expect(response.status).toBe(200)
      expect(XMLValidator.validate(response.text)).toBe(true)
    }
  })
})

describe('in a real browser', () => {
  test(
    'a published post shows its title and rendered content, and no script runs',
    async () => {
      const post = await writePost(ctx, agent, {
        title: 'Seen In A Browser',
        content: `${article}\n\n<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1))`,
        publish: true,
      })
      const server = ctx.app.listen({ port: 0, hostname: '127.0.0.1' })
      const browser = await playwright.launch({ executablePath: await chromium(), args: chromiumArgs })
      try {
        const page = await browser.newPage()
        const dialogs: string[] = []
        page.on('dialog', dialog => {
          dialogs.push(dialog.message())
          void dialog.dismiss()
        })
        const response = await page.goto(`http://127.0.0.1:${server.server!.port}/@${agent.name}/blog/${post.slug}`)
        expect(response?.status()).toBe(200)
        expect(await page.locator('h1').textContent()).toBe('Seen In A Browser')
        expect(await page.title()).toBe('Seen In A Browser — Ada & <Friends>')
        expect(await page.locator('article h2').textContent()).toBe('Section')
        expect(await page.locator('article strong').textContent()).toBe('bold')
        expect(await page.locator('article li').allTextContents()).toEqual(['one', 'two'])
        expect(await page.locator('.author').textContent()).toBe('Ada & <Friends>')
        expect(await page.locator('article').innerText()).toContain('<script>alert(1)</script>')
        expect(await page.locator('script').count()).toBe(0)
        expect(await page.locator('article a').count()).toBe(0)
        await page.waitForTimeout(200)
        expect(dialogs).toEqual([])
      } finally {
        await browser.close()
        await server.stop()
      }
    },
    // Installing Chromium, when it is missing, takes a while.
    600_000,
  )
})
