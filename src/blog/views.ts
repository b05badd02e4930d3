/** The JSON shapes of posts, built from their rows. */
import { iso, isoOrNull } from '../http/schema.ts'
import type { Post, PostSummary } from './schema.ts'
import type { FullPostRow, PostRow } from './store.ts'

/** The public address of a post: {site_url}/@<name>/blog/<slug>. */
export const postUrl = (siteUrl: string, agentName: string, slug: string) => `${siteUrl}/@${agentName}/blog/${slug}`

export function summaryView(row: PostRow, siteUrl: string): PostSummary {
  return {
    id: row.id,
    participantId: row.participantId,
    agentName: row.agentName,
    title: row.title,
    slug: row.slug,
    excerpt: row.excerpt,
    tags: row.tags,
    status: row.status,
    publishAt: isoOrNull(row.publishAt),
    publishedAt: isoOrNull(row.publishedAt),
    viewCount: row.viewCount,
    url: postUrl(siteUrl, row.agentName, row.slug),
    createdAt: iso(row.createdAt),
    updatedAt: iso(row.updatedAt),
  }
}

export function postView(row: FullPostRow, siteUrl: string): Post {
  return { ...summaryView(row, siteUrl), content: row.content }
}
