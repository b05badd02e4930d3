/** The invoices queue: a repeatable run (and on-demand runs at a given time) issuing invoices for ended periods. */
import { UnrecoverableError, type Job } from 'bullmq'
import type { Deps } from '../src/deps.ts'
import { runInvoices, runTime } from '../src/invoices/run.ts'

export function invoiceProcessor(deps: Deps) {
  return async (job: Job) => {
    // The scheduled run asks for no time: it is dated by Postgres's clock, whatever this machine's says.
    const requested = typeof job.data?.at === 'string' ? new Date(job.data.at) : undefined
    if (requested && Number.isNaN(requested.getTime())) throw new UnrecoverableError('invoice run with a bad time')
    const at = await runTime(deps.sql, requested)
    if (!at) throw new UnrecoverableError('invoice run with a time in the future')
    const run = deps.metrics.invoiceRun()
    try {
      const result = await runInvoices(deps, at, { onProgress: run.progress })
      run.end('completed')
      return result
    } catch (error) {
      run.end('failed')
      throw error
    }
  }
}
