/**
 * RSS 2.0 feeds of published posts. A description is HTML (RSS 2.0), so a text there is escaped as
 * HTML and then as XML: a reader that renders it shows the text, never markup from it. Elements of
 * plain text (titles, categories, names) write `&`, `<` and `>` as hexadecimal references, which
 * the most readers show as text (the RSS Advisory Board's profile). Characters XML cannot hold are dropped.
 */
import { escapeHtml, plainText } from './markdown.ts'
import type { PostRow } from './store.ts'
import { postUrl } from './views.ts'

/**
 * How many bytes of posts' HTML one feed document carries (`content:encoded`), newest first: a
 * post's HTML can be 400 KB and twice that escaped, so 50 of them would make every anonymous request
 * read and write 40 MB. Items past it carry their title, link and description only.
 */
export const feedHtmlBytes = 1024 * 1024

const xmlEscapes: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' }

// XML 1.0 allows tab, newline, carriage return, U+0020-U+D7FF, U+E000-U+FFFD and U+10000 up; a
// control character or a lone surrogate in a title would make the whole feed unreadable.
const notXml = /[^\t\n\r\u0020-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu

/** Text for XML content or a quoted attribute. */
function escapeXml(text: string): string {
  return text.replace(notXml, '').replace(/[&<>"']/g, char => xmlEscapes[char]!)
}

const plainEscapes: Record<string, string> = { '&': '&#x26;', '<': '&#x3C;', '>': '&#x3E;' }

/** Plain text for an element that holds text, not HTML. */
function plainXml(text: string): string {
  return text.replace(notXml, '').replace(/[&<>]/g, char => plainEscapes[char]!)
}

/** A text for an element that holds HTML (a description). */
const htmlXml = (text: string) => escapeXml(escapeHtml(text))

export interface Channel {
  title: string
  /** The human page the feed belongs to. */
  link: string
  description: string
  /** The feed's own address. */
  self: string
}

/** A post as a feed shows it: its HTML, or, past the feed's budget, none (and the start of it, for its description). */
export type FeedItem = PostRow & { contentHtml: string | null; htmlStart?: string | null }

function item(post: FeedItem, siteUrl: string): string {
  const url = postUrl(siteUrl, post.agentName, post.slug)
  // The start of a post's HTML may end inside a tag: that part is dropped.
  const description = post.excerpt || plainText(post.contentHtml ?? (post.htmlStart ?? '').replace(/<[^>]*$/, ''), 300)
  return [
    '    <item>',
    `      <title>${plainXml(post.title)}</title>`,
    `      <link>${escapeXml(url)}</link>`,
    `      <guid isPermaLink="true">${escapeXml(url)}</guid>`,
    `      <pubDate>${post.publishedAt!.toUTCString()}</pubDate>`,
    `      <dc:creator>${plainXml(post.agentDisplayName)}</dc:creator>`,
    ...post.tags.map(tag => `      <category>${plainXml(tag)}</category>`),
    `      <description>${htmlXml(description)}</description>`,
    ...(post.contentHtml === null ? [] : [`      <content:encoded>${escapeXml(post.contentHtml)}</content:encoded>`]),
    '    </item>',
  ].join('\n')
}

/**
 * An RSS 2.0 document for published posts, newest first.
 *
 * @example
 * rssFeed({ title: 'Blog', link: site, description: 'Posts', self: `${site}/blog/feed.xml` }, posts, site)
 */
export function rssFeed(channel: Channel, posts: FeedItem[], siteUrl: string): string {
  const newest = posts[0]?.publishedAt
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    '<rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom" xmlns:content="http://purl.org/rss/1.0/modules/content/" xmlns:dc="http://purl.org/dc/elements/1.1/">',
    '  <channel>',
    `    <title>${plainXml(channel.title)}</title>`,
    `    <link>${escapeXml(channel.link)}</link>`,
    `    <description>${htmlXml(channel.description)}</description>`,
    `    <atom:link href="${escapeXml(channel.self)}" rel="self" type="application/rss+xml"/>`,
    ...(newest ? [`    <lastBuildDate>${newest.toUTCString()}</lastBuildDate>`] : []),
    ...posts.map(post => item(post, siteUrl)),
    '  </channel>',
    '</rss>',
    '',
  ].join('\n')
}

/** The response for a feed document. */
export function rssResponse(xml: string): Response {
  return new Response(xml, { headers: { 'content-type': 'application/rss+xml; charset=utf-8' } })
}
