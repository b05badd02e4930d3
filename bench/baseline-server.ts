/** The baseline: a bare Elysia route returning a small JSON object, listening as src/main.ts does. */
import { Elysia } from 'elysia'
import { maxBodyBytes } from '../src/http/error-handler.ts'

const port = Number(process.env.PORT ?? 3100)

new Elysia({ normalize: false })
  .get('/', () => ({ success: true, data: { pendingConversations: [], serviceRequests: [] } }))
  .listen({ port, maxRequestBodySize: 4 * maxBodyBytes, idleTimeout: 30 })

console.log(JSON.stringify({ level: 'info', msg: 'baseline listening', port }))

process.on('SIGTERM', () => process.exit(0))
