/** The API as `src/main.ts --api` serves it, plus probe routes that share every global hook: for bench/http-decompose.ts. */
import { Elysia } from 'elysia'
import { loadConfig } from '../src/config.ts'
import { createLog } from '../src/log.ts'
import { createDeps } from '../src/deps.ts'
import { createApp } from '../src/app.ts'
import { authPlugin } from '../src/auth/plugin.ts'
import { serverOptions } from '../src/http/server-options.ts'

const deps = await createDeps(loadConfig(process.env), { log: createLog('warn') })
// The bare route's handler (bench/baseline-server.ts), in the app: its hooks' cost, then with the agent's authentication too.
const bare = () => ({ success: true, data: { pendingConversations: [], serviceRequests: [] } })
const app = createApp(deps)
  .get('/probe/bare', bare)
  .use(new Elysia().use(authPlugin(deps.authenticator)).get('/probe/agent', bare, { agent: true }))
app.listen({ port: Number(process.env.PORT), idleTimeout: 30, ...serverOptions(deps.log) })
console.log(JSON.stringify({ level: 'info', msg: 'probe server listening', port: app.server?.port }))

process.on('SIGTERM', () => {
  void app
    .stop()
    .then(() => deps.close())
    .then(() => process.exit(0))
})
