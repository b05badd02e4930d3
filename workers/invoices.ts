/** The invoices queue: a repeatable run (and on-demand runs at a given time) issuing invoices for ended periods. */
import { UnrecoverableError, type Job } from 'bullmq'
import type { Deps } from '../src/deps.ts'
import { runInvoices } from '../src/invoices/run.ts'

/** Clock differences between the machine that asked and this one. */
const futureToleranceMs = 60_000

export function invoiceProcessor(deps: Deps) {
  const { clock, queues } = deps
  return async (job: Job) => {
    const at = typeof job.data?.at === 'string' ? new Date(job.data.at) : clock.now()
    if (Number.isNaN(at.getTime())) throw new UnrecoverableError('invoice run with a bad time')
    // Invoices are issued for periods that have ended: a run dated ahead would bill running ones.
    if (at.getTime() > clock.now().getTime() + futureToleranceMs) throw new UnrecoverableError('invoice run with a time in the future')
    return runInvoices({ ...deps, metering: queues.metering }, at)
  }
}
