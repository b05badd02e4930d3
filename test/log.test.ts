import { describe, expect, test } from 'bun:test'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { projectRoot } from './helpers/processes.ts'

describe('the log on stdout', () => {
  test('a reader that stops reading costs lines, counted once it reads again, never a frozen process', async () => {
    // 3 MB of log while stdout's reader reads nothing: past the pipe (64 KiB) and the backlog allowed
    // (1 MiB). The reader starts once the writer is through, which a console writing in place never was.
    const lines = 3000
    const go = join(mkdtempSync(join(tmpdir(), 'am-log-')), 'go')
    const writer = `
      import { createLog, stdoutFlushed } from ${JSON.stringify(join(projectRoot, 'src/log.ts'))}
      const log = createLog('info')
      for (let i = 0; i < ${lines}; i++) log.info('filler', { text: 'x'.repeat(1000) })
      console.error('written')
      await stdoutFlushed(60_000)
      log.info('after')
      await stdoutFlushed(60_000)
      process.exit(0)
    `
    const reader = `"$0" -e "$1" | { while [ ! -e ${go} ]; do sleep 0.05; done; cat; }`
    const proc = Bun.spawn(['sh', '-c', reader, process.execPath, writer], {
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const stdout = new Response(proc.stdout).text()
    const { value } = await proc.stderr.getReader().read()
    expect(new TextDecoder().decode(value)).toBe('written\n')
    await Bun.write(go, '')

    expect(await proc.exited).toBe(0)
    const records = (await stdout)
      .trimEnd()
      .split('\n')
      .map(line => JSON.parse(line))
    const written = records.filter(record => record.msg === 'filler').length
    const dropped = records.find(record => record.msg === 'log lines dropped: stdout was not being read')
    // What the pipe holds (64 KiB) and the backlog the log allows (stdoutBacklogBytes: 1 MiB), no more.
    expect(written * 1000).toBeLessThan(1024 * 1024 + 100_000)
    expect(written + dropped.dropped).toBe(lines)
    expect(records.at(-1).msg).toBe('after')
  }, 15_000)
})

describe('the log on a stdout whose reader has gone', () => {
  test('loses the log, and nothing else: no crash, no exit held waiting to flush', async () => {
    // `| head -1`: the reader takes one line and leaves; every later write meets EPIPE. No
    // unhandledRejection handler here, as in a CLI or a test that uses the log.
    const writer = `
      import { createLog, stdoutFlushed } from ${JSON.stringify(join(projectRoot, 'src/log.ts'))}
      const log = createLog('info')
      for (let i = 0; i < 50; i++) {
        log.info('line', { i, text: 'x'.repeat(2000) })
        await Bun.sleep(20)
      }
      // A reader gone is not one behind: nothing to wait for (the test's timeout is shorter).
      await stdoutFlushed(60_000)
      console.error('done')
    `
    const proc = Bun.spawn(['sh', '-c', '{ "$0" -e "$1"; echo "exit $?" >&2; } | head -1 >/dev/null', process.execPath, writer], {
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const [stderr] = await Promise.all([new Response(proc.stderr).text(), proc.exited])
    expect(stderr).toBe('done\nexit 0\n')
  }, 15_000)
})
