/** The baseline: a bare Elysia route returning a small JSON object, listening as src/main.ts does. */
import { Elysia } from 'elysia'
import { serverOptions } from '../src/http/server-options.ts'
import { createLog } from '../src/log.ts'

const port = Number(process.env.PORT ?? 3100)

new Elysia({ normalize: false })
  .get('/', () => ({ success: true, data: { pendingConversations: [], serviceRequests: [] } }))
  .listen({ port, idleTimeout: 30, ...serverOptions(createLog('info')) })

console.log(JSON.stringify({ level: 'info', msg: 'baseline listening', port }))

process.on('SIGTERM', () => process.exit(0))
