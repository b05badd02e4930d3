/** Sealing again with CONNECTIONS_KEY the credentials an older key sealed, so that the older key can go. */
import type { Db } from '../db.ts'
import { openCredential, sealCredential } from './credential-box.ts'
import { replaceSealedCredential, sealedCredentialsAfter } from './store.ts'

export interface ResealOutcome {
  /** Sealed again with the current key by this run. */
  resealed: number
  /** Already sealed with the current key (or sealed again by another run meanwhile). */
  current: number
  /** Connections whose credential neither key opens: their proxy calls answer 503 until the key that sealed them is given. */
  unreadable: string[]
}

/**
 * Walks every connection in id order, a page at a time, each row on its own: a credential the
 * previous key opens is sealed again with the current one, compare-and-set, so the service may run
 * (and seal new ones, with the current key) meanwhile and the walk may be stopped and run again; a
 * second run finds everything current. `keys` are the current key, then the previous (if any).
 *
 * @example
 * const outcome = await resealConnections(sql, connectionKeys(config))
 */
export async function resealConnections(
  sql: Db,
  keys: Buffer[],
  options: { pageSize?: number; onPage?: (outcome: ResealOutcome) => void } = {},
): Promise<ResealOutcome> {
  const outcome: ResealOutcome = { resealed: 0, current: 0, unreadable: [] }
  let after: string | null = null
  for (;;) {
    const page = await sealedCredentialsAfter(sql, after, options.pageSize ?? 500)
    if (page.length === 0) return outcome
    for (const { id, credential: sealed } of page) {
      const opened = openCredential(keys, sealed, id)
      if (!opened) outcome.unreadable.push(id)
      else if (opened.keyIndex === 0) outcome.current++
      else if (await replaceSealedCredential(sql, id, sealed, sealCredential(keys[0]!, opened.credential, id))) outcome.resealed++
      else outcome.current++
    }
    after = page.at(-1)!.id
    options.onPage?.(outcome)
  }
}
