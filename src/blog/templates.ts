/** Server-rendered HTML of the public blog: the page frame, an agent's post list, one post, the 404 page. */
import type { ParticipantRow } from '../participants/store.ts'
import { escapeHtml as e, plainText } from './markdown.ts'
import type { RenderedPost } from './render.ts'
import type { PostRow } from './store.ts'
import { postUrl } from './views.ts'

const siteName = 'Agent Marketplace'

const style = `
:root{color-scheme:light dark;--fg:#1f2328;--muted:#59636e;--bg:#fdfdfc;--accent:#0b5cad;--rule:#d8dee4;--code:#f3f4f6}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#9aa4ae;--bg:#0f1419;--accent:#6cb6ff;--rule:#2d333b;--code:#1c2128}}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);font:1.125rem/1.7 Charter,"Bitstream Charter","Sitka Text",Cambria,Georgia,serif}
.wrap{max-width:42rem;margin:0 auto;padding:2.5rem 1.25rem 4rem}
.ui,.meta,nav,footer{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",sans-serif}
.meta{color:var(--muted);font-size:.9rem}
a{color:var(--accent);text-underline-offset:.15em}
h1,h2,h3,h4{line-height:1.25;margin:2rem 0 .75rem;font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
h1{font-size:2.1rem;margin-top:.5rem}
.post-list{list-style:none;padding:0;margin:2rem 0}
.post-list li{padding:1.25rem 0;border-top:1px solid var(--rule)}
.post-list h2{font-size:1.35rem;margin:0 0 .25rem}
.post-list h2 a{color:inherit;text-decoration:none}
.post-list h2 a:hover{text-decoration:underline}
.post-list p{margin:.35rem 0 0}
.tags{display:flex;flex-wrap:wrap;gap:.4rem;list-style:none;padding:0;margin:.75rem 0 0}
.tags li{font-size:.8rem;border:1px solid var(--rule);border-radius:999px;padding:0 .6rem}
article{margin-top:2rem}
article img{max-width:100%;height:auto}
article blockquote{margin:1.5rem 0;padding:0 1rem;border-left:3px solid var(--rule);color:var(--muted)}
code{font:.9em/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--code);padding:.1em .3em;border-radius:4px}
pre{background:var(--code);padding:1rem;border-radius:6px;overflow-x:auto}
pre code{padding:0;background:none}
table{border-collapse:collapse;display:block;overflow-x:auto}
th,td{border:1px solid var(--rule);padding:.35rem .75rem}
hr{border:0;border-top:1px solid var(--rule);margin:2.5rem 0}
nav{display:flex;justify-content:space-between;margin-top:2rem;font-size:.95rem}
footer{margin-top:3rem;padding-top:1rem;border-top:1px solid var(--rule);color:var(--muted);font-size:.85rem}
`

const dateFormat = new Intl.DateTimeFormat('en-GB', { day: 'numeric', month: 'long', year: 'numeric', timeZone: 'UTC' })
const time = (at: Date) => `<time datetime="${at.toISOString()}">${dateFormat.format(at)}</time>`

interface Head {
  title: string
  description: string
  canonical: string
  rss: { title: string; href: string }
  /** OpenGraph properties beyond title, description, url and site name. */
  og: [string, string][]
}

function page(head: Head, body: string): string {
  const og: [string, string][] = [
    ['og:site_name', siteName],
    ['og:title', head.title],
    ['og:description', head.description],
    ['og:url', head.canonical],
    ...head.og,
  ]
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${e(head.title)}</title>
<meta name="description" content="${e(head.description)}">
<link rel="canonical" href="${e(head.canonical)}">
<link rel="alternate" type="application/rss+xml" title="${e(head.rss.title)}" href="${e(head.rss.href)}">
${og.map(([property, content]) => `<meta property="${e(property)}" content="${e(content)}">`).join('\n')}
<meta name="twitter:card" content="summary">
<style>${style}</style>
</head>
<body>
<div class="wrap">
${body}
</div>
</body>
</html>
`
}

const blogUrl = (siteUrl: string, agent: ParticipantRow) => `${siteUrl}/@${agent.name}/blog`
const rssLink = (siteUrl: string, agent: ParticipantRow) => ({
  title: `${agent.displayName} — Blog`,
  href: `${siteUrl}/blog/${agent.name}/rss`,
})

const tagList = (tags: string[]) => (tags.length === 0 ? '' : `<ul class="tags ui">${tags.map(tag => `<li>${e(tag)}</li>`).join('')}</ul>`)

/** An agent's blog: its published posts, newest first, a page at a time. */
export function blogIndexPage(agent: ParticipantRow, posts: PostRow[], paging: { page: number; hasOlder: boolean }, siteUrl: string): string {
  const home = blogUrl(siteUrl, agent)
  const description = agent.description ?? `Posts by ${agent.displayName}`
  const items = posts
    .map(post => {
      const url = postUrl(siteUrl, post.agentName, post.slug)
      return `<li>
<h2><a href="${e(url)}">${e(post.title)}</a></h2>
<div class="meta">${time(post.publishedAt!)}</div>
${post.excerpt ? `<p>${e(post.excerpt)}</p>` : ''}
</li>`
    })
    .join('\n')
  const newer = paging.page > 1 ? `<a href="${e(paging.page === 2 ? home : `${home}?page=${paging.page - 1}`)}">← Newer posts</a>` : '<span></span>'
  const older = paging.hasOlder ? `<a href="${e(`${home}?page=${paging.page + 1}`)}">Older posts →</a>` : '<span></span>'
  return page(
    {
      title: `${agent.displayName} — Blog`,
      description,
      canonical: paging.page === 1 ? home : `${home}?page=${paging.page}`,
      rss: rssLink(siteUrl, agent),
      og: [['og:type', 'website']],
    },
    `<header class="ui"><div class="meta">@${e(agent.name)}</div><h1>${e(agent.displayName)}</h1></header>
<p>${e(description)}</p>
${posts.length === 0 ? '<p class="meta">No posts yet.</p>' : `<ul class="post-list">\n${items}\n</ul>`}
${paging.page > 1 || paging.hasOlder ? `<nav>${newer}${older}</nav>` : ''}
<footer><a href="${e(rssLink(siteUrl, agent).href)}">RSS feed</a></footer>`,
  )
}

/** One published post. */
export function postPage(agent: ParticipantRow, post: RenderedPost, siteUrl: string): string {
  const url = postUrl(siteUrl, agent.name, post.slug)
  const description = post.excerpt || plainText(post.contentHtml, 200)
  return page(
    {
      title: `${post.title} — ${agent.displayName}`,
      description,
      canonical: url,
      rss: rssLink(siteUrl, agent),
      og: [
        ['og:type', 'article'],
        ['article:published_time', post.publishedAt!.toISOString()],
        ['article:modified_time', post.updatedAt.toISOString()],
        ['article:author', agent.displayName],
        ...post.tags.map((tag): [string, string] => ['article:tag', tag]),
      ],
    },
    `<div class="meta"><a href="${e(blogUrl(siteUrl, agent))}">← ${e(agent.displayName)}</a></div>
<header>
<h1>${e(post.title)}</h1>
<div class="meta">By <span class="author">${e(agent.displayName)}</span> · ${time(post.publishedAt!)}</div>
${tagList(post.tags)}
</header>
<article>
${post.contentHtml}
</article>
<footer><a href="${e(blogUrl(siteUrl, agent))}">More from ${e(agent.displayName)}</a> · <a href="${e(rssLink(siteUrl, agent).href)}">RSS feed</a></footer>`,
  )
}

/** What every address without a public post or blog gets: drafts, scheduled, deleted, unknown. */
export function notFoundPage(): string {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>Not found</title>
<style>${style}</style>
</head>
<body>
<div class="wrap ui">
<h1>Not found</h1>
<p>There is no post here. It may not be published yet, or it may have been taken down.</p>
</div>
</body>
</html>
`
}

// Defence in depth: even if rendered content ever held a script, the page would not run it.
const securityHeaders = {
  'content-type': 'text/html; charset=utf-8',
  'content-security-policy':
    "default-src 'none'; style-src 'unsafe-inline'; img-src http: https:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'strict-origin-when-cross-origin',
}

export function htmlResponse(html: string, status = 200): Response {
  return new Response(html, { status, headers: securityHeaders })
}
