/** What Postgres can store as text: no NUL character and no unpaired surrogate (which its UTF-8 encoding would turn into U+FFFD). */
export function isStorableText(value: string): boolean {
  return value.isWellFormed() && !value.includes('\u0000')
}

/**
 * A connection URL as it may be shown: everything up to its last `@` hidden, so that a password
 * written unencoded (holding `/` or `@`) is hidden too.
 */
export function redactUrl(url: string): string {
  return url.replace(/\/\/.*@/, '//***@')
}

/** An error's message, its first line only: for a one-line report. */
export const firstLine = (error: unknown): string => (error instanceof Error ? error.message : String(error)).split('\n')[0]!
