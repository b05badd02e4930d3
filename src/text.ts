/** What Postgres can store as text: no NUL character and no unpaired surrogate (which its UTF-8 encoding would turn into U+FFFD). */
export function isStorableText(value: string): boolean {
  return value.isWellFormed() && !value.includes('\u0000')
}

/**
 * Lower-cases A to Z only. `toLowerCase` also folds other scripts' letters into ASCII (the Kelvin sign
 * K, U+212A, becomes `k`), so a lookalike would name what it only resembles.
 */
export const asciiLowerCase = (value: string) => value.replace(/[A-Z]+/g, letters => letters.toLowerCase())

/** Upper-cases a to z only: `toUpperCase` turns `ſ` (U+017F) into `S`, and `ß` into `SS`. */
export const asciiUpperCase = (value: string) => value.replace(/[a-z]+/g, letters => letters.toUpperCase())

/**
 * A connection URL as it may be shown: everything up to its last `@` hidden, so that a password
 * written unencoded (holding `/` or `@`) is hidden too.
 */
export function redactUrl(url: string): string {
  return url.replace(/\/\/.*@/, '//***@')
}

/** An error's message, its first line only: for a one-line report. */
export const firstLine = (error: unknown): string => (error instanceof Error ? error.message : String(error)).split('\n')[0]!
