/** The embedded PostgreSQL of `npm start` without DATABASE_URL: what it says when it cannot start. */
import { describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startEmbeddedPostgres } from '../src/embedded-postgres.ts'
import { createLog } from '../src/log.ts'

describe('the embedded PostgreSQL', () => {
  test('started again on a data directory in use fails with Postgres’s own reason', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'am-embedded-'))
    const log = createLog('error', () => {})
    const first = await startEmbeddedPostgres(dataDir, log)
    try {
      const error = await startEmbeddedPostgres(dataDir, log).catch(e => e)
      expect(error).toBeInstanceOf(Error)
      expect((error as Error).message).toContain('embedded PostgreSQL exited while starting')
      expect((error as Error).message).toMatch(/lock file .*postmaster\.pid.* already exists/)
    } finally {
      await first.stop()
      rmSync(dataDir, { recursive: true, force: true })
    }
  }, 120_000)
})
