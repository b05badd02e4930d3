/** Typed API keys: `sk_usr_`/`sk_agt_`, 32 random base62 characters, a 6-character CRC32 checksum. */
import { createHash, randomBytes } from 'node:crypto'

const alphabet = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
const prefixes = { user: 'sk_usr_', agent: 'sk_agt_' } as const
export type KeyKind = keyof typeof prefixes

const shape = /^sk_(usr|agt)_[0-9A-Za-z]{38}$/

export interface NewKey {
  key: string
  hash: Buffer
  prefix: string
}

/**
 * Makes a key to show once; only its hash and a short prefix are ever stored.
 *
 * @example
 * const { key, hash, prefix } = generateKey('agent') // key: sk_agt_...
 */
export function generateKey(kind: KeyKind): NewKey {
  const body = prefixes[kind] + randomBase62(32)
  const key = body + checksum(body)
  return { key, hash: hashKey(key), prefix: key.slice(0, 12) }
}

/** The kind of a well-formed key with a valid checksum, or null; touches no storage. */
export function keyKind(key: string): KeyKind | null {
  if (!shape.test(key)) return null
  const body = key.slice(0, -6)
  if (checksum(body) !== key.slice(-6)) return null
  return key.startsWith(prefixes.user) ? 'user' : 'agent'
}

export function hashKey(key: string): Buffer {
  return createHash('sha256').update(key).digest()
}

/** The same SHA-256 as hex, in one native call: what the key cache is keyed by on every request. */
export function hashKeyHex(key: string): string {
  return Bun.SHA256.hash(key, 'hex')
}

function checksum(body: string): string {
  let value = Bun.hash.crc32(body)
  let out = ''
  for (let i = 0; i < 6; i++) {
    out = alphabet[value % 62] + out
    value = Math.floor(value / 62)
  }
  return out
}

function randomBase62(length: number): string {
  let out = ''
  while (out.length < length) {
    // 248 = 4 * 62: rejecting bytes above it keeps every character equally likely
    for (const byte of randomBytes(length * 2)) {
      if (byte < 248 && out.length < length) out += alphabet[byte % 62]
    }
  }
  return out
}
