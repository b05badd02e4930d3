/** Scenario 1, the baseline: a bare Elysia route, the same listen settings, the same load and generator work. */
import { runLoad } from '../lib/load.ts'
import { measure } from '../lib/measure.ts'
import { spawnBun, waitHealthy, type Server } from '../lib/proc.ts'
import type { LoadRun, Settings } from '../lib/types.ts'

/** Starts bench/baseline-server.ts and warms it; it stays up so its runs can alternate with the others. */
export async function startBaseline(settings: Settings, options: { port: number; cpu: number; keys: string[]; env: Record<string, string> }) {
  const server = spawnBun(
    'baseline',
    ['bench/baseline-server.ts'],
    { ...options.env, PORT: String(options.port) },
    {
      cpu: options.cpu,
      port: options.port,
    },
  )
  await waitHealthy(server, '/')
  await runLoad({ url: server.url, connections: settings.connections, seconds: settings.warmSeconds, next: baselineRequests(options.keys) })
  return server
}

/** One baseline run as long as one round of a load scenario. */
export function baselineScenario(settings: Settings, server: Server, keys: string[]): Promise<LoadRun> {
  return measure(server.url, baselineRequests(keys), settings.connections, settings.seconds / settings.rounds, [server])
}

/** The generator picks and sets a random agent key per request here too, so its own cost matches the poll's. */
function baselineRequests(keys: string[]) {
  return () => ({ path: '/', headers: { 'x-api-key': keys[Math.floor(Math.random() * keys.length)]! } })
}
