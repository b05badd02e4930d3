/** The invoice run: every ended period invoiced exactly once, after all its usage is counted, in batches. */
import type { Queue } from 'bullmq'
import type { Sql } from '../db.ts'
import { errors } from '../errors.ts'
import { ensurePeriods } from '../billing/subscriptions/store.ts'
import { meteringCaughtUp } from '../metering/caught-up.ts'
import { notifyMany, type NotifyDeps } from '../events/notify.ts'
import { countDuePeriods, issueDueInvoices } from './store.ts'

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
  deps: NotifyDeps & { sql: Sql; metering: Queue },
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
  const total = await countDuePeriods(sql, at)
  let issued = 0
  options.onProgress?.(0, total)
  for (;;) {
    const batch = await issueDueInvoices(sql, at, options.batchSize ?? 5000)
    if (batch.length === 0) break
    issued += batch.length
    await notifyMany(
      deps,
      batch.map(invoice => ({
        userId: invoice.userId,
        type: 'invoice.issued' as const,
        payload: { invoiceId: invoice.id, number: invoice.number, totalCents: invoice.totalCents },
      })),
    )
    options.onProgress?.(issued, Math.max(total, issued))
  }
  if (issued > 0) log.info('invoices issued', { issued, at: at.toISOString() })
  return { issued }
}
