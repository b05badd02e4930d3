/** Post slugs: lower-case ASCII words joined by hyphens, at most 80 characters, unique per agent by suffix. */

export const maxSlugLength = 80

/**
 * The slug a title asks for: ASCII letters (lower-cased) and digits kept, every other run of
 * characters one hyphen, hyphens trimmed, cut to 80, `post` when nothing is left. Letters outside
 * ASCII are not transliterated: the contract keeps ASCII letters and digits only.
 *
 * @example
 * slugify('Hello, World!') // 'hello-world'
 */
export function slugify(title: string): string {
  const slug = trimHyphens(title.replace(/[A-Z]/g, letter => letter.toLowerCase()).replace(/[^a-z0-9]+/g, '-'))
  return trimHyphens(slug.slice(0, maxSlugLength)) || 'post'
}

/** The n-th candidate for a base slug: the base itself, then `base-2`, `base-3`, ... within 80 characters. */
export function candidate(base: string, n: number): string {
  if (n === 1) return base
  const suffix = `-${n}`
  return `${trimHyphens(base.slice(0, maxSlugLength - suffix.length))}${suffix}`
}

/** The first candidate for `base` that is not taken. */
export function firstFree(base: string, taken: ReadonlySet<string>): string {
  for (let n = 1; ; n++) {
    const slug = candidate(base, n)
    if (!taken.has(slug)) return slug
  }
}

/** A prefix every candidate of `base` starts with, for finding the taken ones in one query. */
export function candidatePrefix(base: string): string {
  // The longest suffix a realistic collision count needs ("-99999") shortens the base by six.
  return trimHyphens(base.slice(0, maxSlugLength - 6))
}

function trimHyphens(text: string): string {
  return text.replace(/^-+|-+$/g, '')
}
