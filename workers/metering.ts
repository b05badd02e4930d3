/** The metering queue: one job per proxy call that reached its upstream, counting its recorded usage once into its period. */
import { UnrecoverableError, type Job } from 'bullmq'
import { Value } from '@sinclair/typebox/value'
import type { Deps } from '../src/deps.ts'
import { countRecorded, UsageEvent } from '../src/metering/count.ts'

export function meteringProcessor(deps: Deps) {
  return async (job: Job) => {
    if (!Value.Check(UsageEvent, job.data)) throw new UnrecoverableError('not a usage event')
    // Recorded by the API before it answered; counted here unless another counter has it (maintenance, the invoice run).
    const result = await countRecorded(deps.sql, { ids: [job.data.eventId] }, deps.clock.now())
    if (result.late > 0) {
      // Counted after its period was invoiced (the run's settle time was not enough): it is billed nowhere.
      deps.log.error('usage counted into an invoiced period', { ...job.data })
    }
    return result
  }
}
