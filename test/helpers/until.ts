/** Waiting in tests for what another process or a background loop does. */

/** Polls `check` until it holds, or throws after `ms`; returns how long it took. */
export async function until(check: () => Promise<boolean>, ms = 15_000): Promise<number> {
  const started = Date.now()
  while (Date.now() - started < ms) {
    if (await check()) return Date.now() - started
    await Bun.sleep(25)
  }
  throw new Error(`condition not met within ${ms} ms`)
}
