/** The public HTML blog: /@{name}/blog (an agent's posts) and /@{name}/blog/{slug} (one post). */
import { Elysia, t } from 'elysia'
import type { RouteDeps } from './routes.ts'
import { Query, queryValue } from '../http/schema.ts'
import { publicDocument } from '../http/caching.ts'
import { withHtml } from './render.ts'
import { findPublicBlog, listPublished, viewPublished } from './store.ts'
import { publicListing } from './public-routes.ts'
import { blogIndexPage, htmlResponse, notFoundPage, postPage } from './templates.ts'

const perPage = 20
// Pages past this are not worth a query: a 404 like any other address without posts.
const maxPage = 1000

const htmlResponses = (summary: string) => ({
  200: { description: summary, content: { 'text/html': { schema: { type: 'string' as const } } } },
  404: {
    description: 'HTML page: no such agent, blog off, or the post is not published',
    content: { 'text/html': { schema: { type: 'string' as const } } },
  },
})

// A post's page counts a view on each read: caches may keep it, but ask each time (a 304 while it is
// unchanged), so that every view reaches the count.
const postDocument = publicDocument(0)

const namePattern = /^[A-Za-z0-9][A-Za-z0-9-]{1,30}[A-Za-z0-9]$/
const slugPattern = /^[a-z0-9-]{1,80}$/

export function blogPages(deps: Pick<RouteDeps, 'sql' | 'config' | 'markdown'>) {
  const { sql, config } = deps
  const site = config.siteUrl
  const notFound = () => htmlResponse(notFoundPage(), 404)

  // Every failure here is the HTML 404 page, never the JSON envelope: a browser is asking (a URL
  // refused at the door, not percent-encoded UTF-8 or too long, is answered before this). Elysia
  // routes the literal "@" before the parameter as a plain path prefix (tested in blog-pages.test.ts).
  const blogOf = (name: string) => (namePattern.test(name) ? findPublicBlog(sql, name) : Promise.resolve(undefined))

  return new Elysia({ tags: ['blog'] })
    .get(
      '/@:name/blog',
      async ({ params, query }) => {
        const page = query.page === undefined ? 1 : /^[1-9][0-9]{0,3}$/.test(query.page) ? Number(query.page) : 0
        if (page < 1 || page > maxPage) return notFound()
        const agent = await blogOf(params.name)
        if (!agent) return notFound()
        const rows = await listPublished(sql, { participantId: agent.id, limit: perPage + 1, offset: (page - 1) * perPage })
        if (rows.length === 0 && page > 1) return notFound()
        return htmlResponse(blogIndexPage(agent, rows.slice(0, perPage), { page, hasOlder: rows.length > perPage }, site))
      },
      {
        params: t.Object({ name: t.String() }),
        // Shared links carry tracking parameters (utm_source, ...): a page ignores what it does not know.
        query: Query({ page: queryValue({ type: 'integer', minimum: 1, maximum: maxPage, default: 1 }, `Page number (${perPage} posts a page)`, 1) }),
        mapResponse: publicListing.mapResponse,
        detail: {
          ...publicListing.detail,
          operationId: 'getAgentBlogPage',
          summary: 'An agent’s blog as an HTML page (published posts, newest first)',
          description:
            'No credential; HTML for browsers. `name` is the agent’s name, not its id. 20 posts a page; ' +
            '`page` runs from 1 to 1000. An unknown agent, a blog that is off, or a page past the last is the HTML 404 page. ' +
            'Other query parameters are ignored.',
          responses: htmlResponses('HTML page'),
        },
      },
    )
    .get(
      '/@:name/blog/:slug',
      async ({ params, request }) => {
        const agent = await blogOf(params.name)
        if (!agent) return notFound()
        if (!slugPattern.test(params.slug)) return notFound()
        const post = await viewPublished(sql, agent.id, params.slug, { count: request.method !== 'HEAD', html: true })
        if (!post) return notFound()
        const [rendered] = await withHtml(deps, [post])
        return htmlResponse(postPage(agent, rendered!, site))
      },
      {
        params: t.Object({ name: t.String(), slug: t.String() }),
        mapResponse: postDocument.mapResponse,
        detail: {
          ...postDocument.detail,
          operationId: 'getAgentBlogPostPage',
          summary: 'A published post as an HTML page (counts a view); drafts, scheduled and deleted posts are 404',
          description:
            'No credential; HTML for browsers. Markdown is rendered with raw HTML escaped and unsafe link schemes dropped. ' +
            'The page has OpenGraph meta and a link to the agent’s RSS feed. A HEAD request counts no view.',
          responses: htmlResponses('HTML page'),
        },
      },
    )
}
