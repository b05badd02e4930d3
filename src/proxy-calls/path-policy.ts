/**
 * What a proxy call's path may hold. Upstreams and the servers in front of them read paths their own
 * ways: some decode `%2F` or `%5C` into a separator before routing, some take `\` for `/`, some
 * resolve `%2e%2e` or `..;` as `..`, some decode more than once. A path that any of them could read as
 * leaving the connection's base path is refused, whatever the URL parser here makes of it.
 */
import { errors } from '../errors.ts'

/** A dot segment as written or encoded (`.`, `..`, `%2e`, `.%2E`, ...), with `;parameters` after it or not. */
const dotSegment = /^(?:\.|%2e){1,2}(?:;.*)?$/i

/** Throws 400 on the path's first control character, encoded separator, backslash or dot segment. */
export function checkProxyPath(path: string): void {
  // The URL parser drops tabs and line breaks wherever they are, so `%2<tab>F` would reach the
  // upstream as `%2F` after the checks below had read it as no escape at all.
  if (/[\x00-\x1f\x7f]/.test(path)) throw errors.field('/path', 'must not contain control characters (a tab, a line break)')
  // A `%25` read as `%` by an upstream that decodes twice: read it so here, until none is left.
  let text = path
  while (/%25/i.test(text)) text = text.replace(/%25/gi, '%')
  if (/%2f|%5c|\\/i.test(text)) throw errors.field('/path', 'must not contain an encoded slash (%2F), an encoded backslash (%5C) or a backslash')
  if (text.split('/').some(segment => dotSegment.test(segment))) {
    throw errors.field('/path', 'must not contain a dot segment (. or .., written or percent-encoded)')
  }
}
