/** The invoice run: every ended period invoiced exactly once, after all its usage is counted, in batches. */
import type { Sql } from '../db.ts'
import { ensurePeriods } from '../billing/subscriptions/store.ts'
import { countRecordedBefore } from '../metering/count.ts'
import type { Log } from '../log.ts'
import { countDuePeriods, issueDueInvoices, type DueCursor } from './store.ts'

/**
 * How long after its end a period is invoiced. A proxy call is timed when it starts and metered
 * when its answer comes (the upstream may take 10 s): one begun just before a period ended is queued
 * for counting only after, and the run must not have invoiced that period by then.
 */
export const invoiceSettleMs = 60_000

/**
 * The time a run asked for `requested` (none: now) is dated: Postgres's clock when that is earlier, so that a
 * period is due a minute after it ended whatever the clock of the machine that asked (a run dated
 * ahead would bill a period whose last calls are still being answered); null for more than a minute
 * ahead, which is no clock difference but a mistake, refused by the worker and `invoices:run`.
 */
export async function runTime(sql: Sql, requested?: Date): Promise<Date | null> {
  const [row] = await sql<{ now: Date }[]>`select now()`
  const now = row!.now
  if (requested === undefined) return now
  if (requested.getTime() > now.getTime() + 60_000) return null
  return requested < now ? requested : now
}

export interface InvoiceRunOptions {
  batchSize?: number
  onProgress?: (done: number, total: number) => void
}

/**
 * @example
 * const { issued } = await runInvoices(deps, (await runTime(deps.sql))!)
 */
export async function runInvoices(deps: { sql: Sql; log: Log }, at: Date, options: InvoiceRunOptions = {}): Promise<{ issued: number }> {
  const { sql, log } = deps
  // Periods nobody called in have no row yet; they are billed all the same.
  await ensurePeriods(sql, at)
  const endedBy = new Date(at.getTime() - invoiceSettleMs)
  // Every call of a due period occurred before it ended: counted first, wherever its job is.
  await countUsageOfDuePeriods(deps, endedBy)
  const total = await countDuePeriods(sql, endedBy)
  let issued = 0
  let after: DueCursor | undefined
  options.onProgress?.(0, total)
  for (;;) {
    const batch = await issueDueInvoices(sql, { endedBy, issuedAt: at }, options.batchSize ?? 5000, after)
    if (batch.issued === 0) break
    issued += batch.issued
    after = batch.last
    options.onProgress?.(issued, Math.max(total, issued))
  }
  if (issued > 0) log.info('invoices issued', { issued, at: at.toISOString() })
  return { issued }
}

/**
 * Counts the usage recorded before `endedBy` and not counted yet (its job still queued, or lost with
 * Redis), so that every call of a due period is on its invoice: batches beside the metering workers
 * (skipping what they hold), then a last pass that waits for what they hold, so nothing they took
 * and let go of uncounted (a rollback) is missed.
 */
async function countUsageOfDuePeriods({ sql, log }: { sql: Sql; log: Log }, endedBy: Date) {
  const beside = await countRecordedBefore(sql, endedBy, new Date())
  const last = await countRecordedBefore(sql, endedBy, new Date(), { wait: true })
  const late = beside.late + last.late
  if (late > 0) log.error('usage counted into an invoiced period', { events: late })
}
