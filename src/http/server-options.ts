/** Options for `listen` (Bun.serve), so that the app sees, and answers in the envelope, what Bun would refuse bare. */
import { randomUUID } from 'node:crypto'
import http from 'node:http'
import type { ErrorLike } from 'bun'
import { errors } from '../errors.ts'
import { errorFields, type Log } from '../log.ts'
import { renderError } from './error-handler.ts'
import { serverHeadBytes } from './request-limits.ts'

/**
 * Raises Bun's limit on a request's head, process-wide (Bun reads the `node:http` setting as it
 * parses), so that heads over the app's limit (request-limits.ts) but under this one reach the app;
 * lifts Bun's body cap, since the app measures every body itself (error-handler.ts) and would
 * otherwise lose those over the cap to Bun's bare 413; and renders anything that escapes the app as
 * the 500 envelope rather than Bun's error page (which shows source outside production). A port
 * another process holds is refused (`Is port N in use?`): Elysia asks Bun to share it, so a second
 * instance, or an old one left running, would silently take half the connections.
 *
 * @example
 * createApp(deps).listen({ port, idleTimeout: config.httpIdleTimeoutS, ...serverOptions(deps.log) })
 */
export function serverOptions(log: Log) {
  // Node's typings have it read-only (Node takes it from --max-http-header-size only); Bun reads and
  // writes it, as the process-wide form of that flag (since Bun 1.1.27).
  ;(http as { maxHeaderSize: number }).maxHeaderSize = serverHeadBytes
  return {
    reusePort: false,
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
    error(error: ErrorLike) {
      // No request here to take an X-Request-Id from: a reference of its own, in the answer and the log.
      const requestId = randomUUID()
      log.error('unhandled server error', { requestId, ...errorFields(error) })
      return renderError(errors.internal(requestId))
    },
  }
}
