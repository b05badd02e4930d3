/** Scenario 1, the baseline: a bare Elysia route, the same listen settings, the same load and generator work. */
import { measure, warmUp, type Bench } from '../lib/measure.ts'
import { spawnBun, waitHealthy, type Server } from '../lib/proc.ts'
import type { LoadRun } from '../lib/types.ts'
import type { RequestLines, Requests } from '../lib/wrk.ts'

/** Starts bench/baseline-server.ts and warms it; it stays up so its runs can alternate with the others. */
export async function startBaseline(bench: Bench, options: { port: number; cpu: number; keys: RequestLines }): Promise<Server> {
  const server = spawnBun('baseline', ['bench/baseline-server.ts'], { ...bench.world.env, PORT: String(options.port) }, options)
  await waitHealthy(server, '/')
  await warmUp(bench, server, baselineRequests(options.keys))
  return server
}

/** One baseline run as long as one round of a load scenario. */
export async function baselineScenario(bench: Bench, server: Server, keys: RequestLines): Promise<LoadRun> {
  const { settings } = bench
  return (await measure(bench, server, baselineRequests(keys), settings.seconds / settings.rounds)).run
}

/** wrk sets a random agent key per request here too, so its own work matches the poll's. */
function baselineRequests(keys: RequestLines): Requests {
  return { path: '/', kind: 'get', lines: keys, order: 'random' }
}
