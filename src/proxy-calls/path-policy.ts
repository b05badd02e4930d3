/**
 * What a proxy call's path may hold. Upstreams and the servers in front of them read paths their own
 * ways: some decode `%2F` or `%5C` into a separator before routing, some take `\` for `/`, some
 * resolve `%2e%2e` or `..;` as `..`, some decode more than once. A path that any of them could read as
 * leaving the connection's base path is refused, whatever the URL parser here makes of it.
 */
import { errors } from '../errors.ts'

/** A dot segment (`.`, `..`), with `;parameters` after it or not. */
const dotSegment = /^\.{1,2}(?:;.*)?$/

/** Throws 400 on the path's first control character, encoded separator, backslash or dot segment. */
export function checkProxyPath(path: string): void {
  // Each segment as an upstream that decodes again and again would read it. No control character
  // in it, as written or as a decoding makes it: the URL parser drops tabs and line breaks wherever
  // they are, so `%2<tab>F` would reach the upstream as `%2F`, and `%2%09F` would, to an upstream
  // that parses a decoded path as a URL again.
  const segments = path.split('/').map(decodedAgainAndAgain)
  if (segments.some(segment => /[\x00-\x1f\x7f]/.test(segment))) {
    throw errors.field('/path', 'must not contain control characters (a tab, a line break), written or percent-encoded')
  }
  if (segments.some(segment => /[/\\]/.test(segment))) {
    throw errors.field('/path', 'must not contain an encoded slash (%2F), an encoded backslash (%5C) or a backslash')
  }
  if (segments.some(segment => dotSegment.test(segment))) {
    throw errors.field('/path', 'must not contain a dot segment (. or .., written or percent-encoded)')
  }
}

/**
 * `text` percent-decoded until no escape is left, as lenient decoders do it: what is no escape (`%2`
 * before `%66`) is kept as written, so `%2%66` is `%2f` once decoded and `/` twice. A byte is read
 * as the character of its code: the separators and dots looked for are ASCII. One pass: an escape is
 * decoded as soon as its last digit is read, and the character it gives may end another before it.
 */
function decodedAgainAndAgain(text: string): string {
  const out: string[] = []
  for (const char of text) {
    out.push(char)
    for (let n = out.length; n >= 3 && out[n - 3] === '%' && isHex(out[n - 2]!) && isHex(out[n - 1]!); n = out.length) {
      const decoded = String.fromCharCode(Number.parseInt(out[n - 2]! + out[n - 1]!, 16))
      out.length = n - 3
      out.push(decoded)
    }
  }
  return out.join('')
}

const isHex = (char: string) => /^[0-9a-f]$/i.test(char)
