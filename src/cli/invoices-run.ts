/** `bun run invoices:run [--at <ISO time>]`: the invoice run, now, with progress on a terminal; prints how many it issued. */
import { loadConfig } from '../config.ts'
import { withDevSecrets } from '../dev-secrets.ts'
import { createDeps, forInvoiceRun } from '../deps.ts'
import { createLog } from '../log.ts'
import { invoiceSettleMs, runInvoices, runTime } from '../invoices/run.ts'
import { reachDatabase } from '../reach-database.ts'
import { requireMigrated } from '../migrate.ts'
import { claimRedisPrefix } from '../redis-prefix.ts'
import { runCli, UsageError } from './run.ts'

const terminal = process.stdout.isTTY === true

function progress(done: number, total: number) {
  if (!terminal || total === 0) return
  const width = 30
  const filled = Math.round((done / total) * width)
  process.stdout.write(`\r[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total}`)
}

/** A date, or a date and time with an optional offset (none: this machine's zone), as ISO 8601 writes them. */
const isoTime = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})?)?$/

const usage =
  'usage: npm run invoices:run -- [--at <ISO 8601 time; later than the database’s now is dated now, more than a minute later refused; default: now>] (needs DATABASE_URL, and the service’s REDIS_URL and REDIS_PREFIX)'

await runCli('invoices:run', usage, { at: { type: 'string' } }, async values => {
  // Without --at, the run is dated by the database's clock. Date alone reads more than ISO 8601, and
  // guesses: `5` as May 2001, `01/12/2026` as 12 January. Its invoices would carry that date.
  const requested = values.at ? new Date(values.at) : undefined
  if (requested && (!isoTime.test(values.at!) || Number.isNaN(requested.getTime()))) {
    throw new UsageError('--at must be an ISO 8601 time, e.g. 2026-12-01T00:00:00Z')
  }
  const config = withDevSecrets(loadConfig(process.env))
  if (!config.databaseUrl) throw new Error('set DATABASE_URL, and REDIS_PREFIX as the service has it (docs/operations.md)')
  await reachDatabase(config.databaseUrl)
  // As the worker does: no statement timeout (the run's first statement reads every subscription).
  const deps = forInvoiceRun(await createDeps(config, { log: createLog('warn') }))
  try {
    await requireMigrated(deps.sql)
    await claimRedisPrefix(deps.sql, deps.redis, deps.keys)
    // Dated by the database's clock when this machine's is ahead of it (src/invoices/run.ts).
    const at = await runTime(deps.sql, requested)
    if (!at) throw new UsageError('--at must not be more than a minute ahead of the database’s clock')
    try {
      const { issued } = await runInvoices(deps, at, { onProgress: progress })
      if (terminal) process.stdout.write('\n')
      const endedBy = new Date(at.getTime() - invoiceSettleMs).toISOString()
      console.log(`issued ${issued} invoice${issued === 1 ? '' : 's'} dated ${at.toISOString()}, for periods ended by ${endedBy}`)
    } catch (error) {
      if (terminal) process.stdout.write('\n')
      throw error
    }
  } finally {
    await deps.close()
  }
})
