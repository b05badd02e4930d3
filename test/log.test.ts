import { describe, expect, test } from 'bun:test'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { projectRoot } from './helpers/processes.ts'
import { createLog, maxLineBytes } from '../src/log.ts'

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

describe('a record too long for one line of a log collector', () => {
  const written = (fields: Record<string, unknown>, msg = 'long') => {
    const lines: string[] = []
    createLog('info', line => lines.push(line)).error(msg, fields)
    expect(lines.length).toBe(1)
    // Docker's json-file and CRI runtimes split lines at 16 KiB, newline included.
    expect(Buffer.byteLength(`${lines[0]}\n`)).toBeLessThanOrEqual(maxLineBytes)
    return JSON.parse(lines[0]!)
  }

  test('has its long strings cut, each saying how long it was, and keeps the rest whole', () => {
    const record = written({ error: 'x'.repeat(1_000_000), stack: 'Error: x\n    at f (a.ts:1:1)', code: '22P02' })
    expect(record).toEqual({
      time: expect.any(String),
      level: 'error',
      msg: 'long',
      error: `${'x'.repeat(4096)}… (cut from 1000000 characters)`,
      stack: 'Error: x\n    at f (a.ts:1:1)',
      code: '22P02',
    })
  })

  test('bytes count, not characters: text of three-byte characters and escaped control characters is cut too', () => {
    expect(written({ text: '€'.repeat(6000) }).text).toStartWith('€€€')
    expect(written({ text: '\u0001'.repeat(6000), more: '\u0002'.repeat(6000) }).text).toStartWith('\u0001')
    // A surrogate pair is never split: the cut string has no lone half.
    const emoji = written({ text: `x${'😀'.repeat(10_000)}` }).text as string
    expect(emoji).toBe(emoji.toWellFormed())
  })

  test('has long arrays and nested strings cut when cutting strings alone is not enough', () => {
    const ids = Array.from({ length: 1000 }, (_, i) => `0195f3a0-0000-7000-8000-${String(i).padStart(12, '0')}`)
    const record = written({ postIds: ids, nested: { deep: ['y'.repeat(100_000)] } })
    expect(record.postIds).toEqual([...ids.slice(0, 20), '… (cut from 1000 items)'])
    expect(record.nested.deep[0]).toBe(`${'y'.repeat(256)}… (cut from 100000 characters)`)
  })

  test('with too many fields for any cut keeps its time, level and message and says how long it was', () => {
    const fields = Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`field${i}`, i]))
    const record = written(fields, 'm'.repeat(10_000))
    expect(Object.keys(record)).toEqual(['time', 'level', 'msg', 'cutFromBytes'])
    expect(record.msg).toBe(`${'m'.repeat(256)}… (cut from 10000 characters)`)
    expect(record.cutFromBytes).toBeGreaterThan(maxLineBytes)
  })
})
