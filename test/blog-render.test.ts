/** The Markdown renderer's thread: its time limit, its queue bound and its shutdown, on a real worker. */
import { describe, expect, test } from 'bun:test'
import { createMarkdownRenderer, RendererBusy } from '../src/blog/render.ts'
import { createLog } from '../src/log.ts'
import { brokenRenderer, slowLoadingRenderer } from './helpers/blog.ts'

const log = createLog('error')
// Seconds of marked's time at the allowed size; a quarter of a second here is far over any limit.
const slow = '_a'.repeat(49_000)

describe('the markdown renderer', () => {
  test('renders, and refuses (null) what runs over its limit; the render queued behind gets a fresh thread', async () => {
    const renderer = createMarkdownRenderer({ log, timeoutMs: 250 })
    try {
      expect(await renderer.render('Some *text*.')).toBe('<p>Some <em>text</em>.</p>\n')
      const [stalled, next] = await Promise.all([renderer.render(slow), renderer.render('After **that**.')])
      expect(stalled).toBeNull()
      expect(next).toBe('<p>After <strong>that</strong>.</p>\n')
      // Nested past marked's stack: refused as well, without waiting for the limit.
      expect(await renderer.render('>'.repeat(10_000))).toBeNull()
    } finally {
      await renderer.close()
    }
  })

  test('refuses with RendererBusy past its waiting renders, and takes more once they are done', async () => {
    const renderer = createMarkdownRenderer({ log, timeoutMs: 250, maxWaiting: 1 })
    try {
      const running = renderer.render(slow)
      const waiting = renderer.render('Second.')
      await expect(renderer.render('Third.')).rejects.toBeInstanceOf(RendererBusy)
      expect(await running).toBeNull()
      expect(await waiting).toBe('<p>Second.</p>\n')
      expect(await renderer.render('Fourth.')).toBe('<p>Fourth.</p>\n')
    } finally {
      await renderer.close()
    }
  })

  test('a render that cannot start within its wait is refused with RendererBusy; cheap ones in a burst all run', async () => {
    const renderer = createMarkdownRenderer({ log, timeoutMs: 400, maxWaitMs: 100 })
    try {
      const running = renderer.render(slow)
      await expect(renderer.render('Behind it.')).rejects.toBeInstanceOf(RendererBusy)
      expect(await running).toBeNull()
      // The slow render's thread was ended: the next render starts a fresh one (its start is not
      // waiting for a turn, and on a loaded machine takes longer than the whole wait allowed).
      expect(await renderer.render('Warm.')).toBe('<p>Warm.</p>\n')
      const burst = await Promise.all(Array.from({ length: 20 }, (_, i) => renderer.render(`Post ${i}.`)))
      expect(burst).toEqual(Array.from({ length: 20 }, (_, i) => `<p>Post ${i}.</p>\n`))
    } finally {
      await renderer.close()
    }
  })

  test('close waits for the renders under way, then takes none', async () => {
    const renderer = createMarkdownRenderer({ log, timeoutMs: 2000 })
    const under = renderer.render('# Title')
    await renderer.close()
    expect(await under).toBe('<h1>Title</h1>\n')
    await expect(renderer.render('late')).rejects.toThrow('closed')
  })

  test('a thread whose module cannot load blocks the loop once, logged, not at every render', async () => {
    const lines: string[] = []
    const renderer = brokenRenderer(createLog('error', line => lines.push(line)))
    try {
      // The first start waits for the thread to load (2 s), then the thread fails.
      await expect(renderer.render('First.')).rejects.toThrow('a broken deploy')
      // The next ones are refused at once: a feed of unrendered posts shows them as text.
      const started = performance.now()
      for (const text of ['Second.', 'Third.', 'Fourth.']) await expect(renderer.render(text)).rejects.toBeInstanceOf(RendererBusy)
      expect(performance.now() - started).toBeLessThan(500)
      const said = lines.map(line => JSON.parse(line) as { msg: string }).filter(record => record.msg.includes('did not load in time'))
      expect(said).toHaveLength(1)
    } finally {
      await renderer.close()
    }
  })

  test('a thread that loads late (a busy machine) but loads refuses nothing: after a render over its limit, the next starts a thread', async () => {
    const lines: string[] = []
    const renderer = slowLoadingRenderer(
      createLog('error', line => lines.push(line)),
      2300,
      { timeoutMs: 1500 },
    )
    try {
      // The first start waits 2 s and is logged; the thread loads a moment later and renders.
      expect(await renderer.render('One.')).toBe('<p>One.</p>\n')
      expect(lines.some(line => line.includes('did not load in time'))).toBe(true)
      // Over its limit: the thread is ended, and the next render needs a new one (it used to be refused for a minute).
      expect(await renderer.render(slow)).toBeNull()
      expect(await renderer.render('Two.')).toBe('<p>Two.</p>\n')
    } finally {
      await renderer.close()
    }
  }, 15_000)
})
