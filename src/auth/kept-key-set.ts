/** The identity provider's last key set fetched, kept in Redis for the processes that hold none of their own. */
import type { ExportedJWKSCache } from 'jose'
import { defineScript, type Redis } from '../redis.ts'

/** Where processes leave the key sets they fetch, and where one with none of its own finds the newest. */
export interface KeptKeySet {
  /** The newest set kept for this provider, with when it was fetched; undefined when none is. */
  load(): Promise<ExportedJWKSCache | undefined>
  /** Keeps `set` unless one fetched later is kept already. */
  save(set: ExportedJWKSCache): Promise<void>
}

// Kept only when newer than what is there (processes fetch at their own times), until it is no longer
// of use (`until`: a time in ms).
const keepNewer = defineScript(`
  local kept = redis.call('hget', KEYS[1], 'uat')
  if kept and tonumber(kept) >= tonumber(ARGV[1]) then return 0 end
  redis.call('hset', KEYS[1], 'uat', ARGV[1], 'url', ARGV[2], 'jwks', ARGV[3])
  redis.call('pexpireat', KEYS[1], ARGV[4])
  return 1
`)

/**
 * The key set kept under `key` for the JWKS at `url` (a set kept for another URL, before the
 * configuration changed, is none), for `keepMs` after its fetch.
 *
 * @example
 * const kept = keptKeySet(redis, keys.jwks, config.auth.jwksUrl, staleKeysForMs)
 * await kept.save({ jwks, uat: Date.now() })
 */
export function keptKeySet(redis: Redis, key: string, url: string, keepMs: number): KeptKeySet {
  return {
    async load() {
      const [uat, keptUrl, jwks] = await redis.hmget(key, 'uat', 'url', 'jwks')
      if (!uat || !jwks || keptUrl !== url) return undefined
      return { uat: Number(uat), jwks: JSON.parse(jwks) }
    },
    async save(set) {
      await keepNewer(redis, [key], [set.uat, url, JSON.stringify(set.jwks), set.uat + keepMs])
    },
  }
}
