/** The invoice run: every ended period invoiced exactly once, after all its usage is counted, in batches. */
import type { Queue } from 'bullmq'
import type { Sql } from '../db.ts'
import { errors } from '../errors.ts'
import { ensurePeriods } from '../billing/subscriptions/store.ts'
import { meteringCaughtUp } from '../metering/caught-up.ts'
import type { Log } from '../log.ts'
import { countDuePeriods, issueDueInvoices, type DueCursor } from './store.ts'

/**
 * How long after its end a period is invoiced. A proxy call is timed when it starts and metered
 * when its answer comes (the upstream may take 10 s): one begun just before a period ended is queued
 * for counting only after, and the run must not have invoiced that period by then.
 */
export const invoiceSettleMs = 60_000

/**
 * Whether a run dated `at` lies in the future (beyond a minute of clock difference between the
 * machine that asked and this one). Invoices are issued for periods that have ended: such a run
 * would bill periods still running, so the worker and `invoices:run` refuse it.
 */
export function isFutureRun(at: Date, now: Date): boolean {
  return at.getTime() > now.getTime() + 60_000
}

export interface InvoiceRunOptions {
  batchSize?: number
  /** How long to wait for queued usage of ended periods to be counted before giving up this run. */
  meteringWaitMs?: number
  onProgress?: (done: number, total: number) => void
}

/**
 * @example
 * const { issued } = await runInvoices({ ...deps, metering: deps.queues.metering }, new Date())
 */
export async function runInvoices(
  deps: { sql: Sql; log: Log; metering: Queue },
  at: Date,
  options: InvoiceRunOptions = {},
): Promise<{ issued: number }> {
  const { sql, log, metering } = deps
  const deadline = Date.now() + (options.meteringWaitMs ?? 60_000)
  while (!(await meteringCaughtUp(metering, at))) {
    if (Date.now() > deadline) throw errors.unavailable('Usage of ended periods is still being counted; run again later')
    await Bun.sleep(250)
  }
  // Periods nobody called in have no row yet; they are billed all the same.
  await ensurePeriods(sql, at)
  const endedBy = new Date(at.getTime() - invoiceSettleMs)
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
