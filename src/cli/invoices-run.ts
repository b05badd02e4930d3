/** `bun run invoices:run [--at <ISO time>]`: the invoice run, now, with progress on a terminal; prints how many it issued. */
import { parseArgs } from 'node:util'
import { loadConfig } from '../config.ts'
import { withDevSecrets } from '../dev-secrets.ts'
import { createDeps } from '../deps.ts'
import { createLog } from '../log.ts'
import { invoiceSettleMs, runInvoices, runTime } from '../invoices/run.ts'

const { values } = parseArgs({ options: { at: { type: 'string' } } })
// Without --at, the run is dated by the database's clock.
const requested = values.at ? new Date(values.at) : undefined
if (requested && Number.isNaN(requested.getTime())) {
  console.error('invoices:run: --at must be an ISO 8601 time, e.g. 2026-12-01T00:00:00Z')
  process.exit(2)
}
const config = withDevSecrets(loadConfig(process.env))
if (!config.databaseUrl) {
  console.error('invoices:run: set DATABASE_URL')
  process.exit(1)
}
const deps = await createDeps(config, { log: createLog('warn') })
// Dated by the database's clock when this machine's is ahead of it (src/invoices/run.ts).
const at = await runTime(deps.sql, requested)
if (!at) {
  console.error('invoices:run: --at must not be in the future')
  await deps.close()
  process.exit(2)
}
const terminal = process.stdout.isTTY === true

function progress(done: number, total: number) {
  if (!terminal || total === 0) return
  const width = 30
  const filled = Math.round((done / total) * width)
  process.stdout.write(`\r[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total}`)
}

try {
  const { issued } = await runInvoices(deps, at, { onProgress: progress })
  if (terminal) process.stdout.write('\n')
  const endedBy = new Date(at.getTime() - invoiceSettleMs).toISOString()
  console.log(`issued ${issued} invoice${issued === 1 ? '' : 's'} dated ${at.toISOString()}, for periods ended by ${endedBy}`)
} catch (error) {
  if (terminal) process.stdout.write('\n')
  console.error(`invoices:run: ${error instanceof Error ? error.message : String(error)}`)
  process.exitCode = 1
} finally {
  await deps.close()
}
