/** The metering queue: one job per proxy call that reached its upstream, counted once into its period. */
import { UnrecoverableError, type Job } from 'bullmq'
import { Value } from '@sinclair/typebox/value'
import type { Deps } from '../src/deps.ts'
import { countUsage, UsageEvent } from '../src/metering/count.ts'

export function meteringProcessor({ sql, clock }: Deps) {
  return async (job: Job) => {
    if (!Value.Check(UsageEvent, job.data)) throw new UnrecoverableError('not a usage event')
    return countUsage(sql, job.data, clock.now())
  }
}
