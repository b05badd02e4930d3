/** The caller's address, for per-IP limits where there is no credential. */
import type { Server } from 'bun'

export function clientIp(server: Server<unknown> | null | undefined, request: Request): string {
  return server?.requestIP(request)?.address ?? 'local'
}
