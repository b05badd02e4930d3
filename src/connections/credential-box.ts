/** Connected-account credentials sealed with AES-256-GCM, bound to their connection id. */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import type { Config } from '../config.ts'

/**
 * The keys that open credentials: CONNECTIONS_KEY, which alone seals, then CONNECTIONS_KEY_PREVIOUS
 * while a rotation lasts (until `connections:reseal` has sealed everything with the new key).
 */
export function connectionKeys(config: Pick<Config, 'connectionsKey' | 'connectionsKeyPrevious'>): Buffer[] {
  return [config.connectionsKey, config.connectionsKeyPrevious].filter((key): key is Buffer => key !== undefined)
}

/**
 * @example
 * const sealed = sealCredential(key, 'token-123', connectionId)
 * openCredential([key], sealed, connectionId) // { credential: 'token-123', keyIndex: 0 }
 */
export function sealCredential(key: Buffer, plaintext: string, connectionId: string): Buffer {
  const nonce = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, nonce)
  cipher.setAAD(Buffer.from(connectionId))
  const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()])
  return Buffer.concat([nonce, cipher.getAuthTag(), ciphertext])
}

/**
 * The credential and which of `keys` opened it (the first that does); undefined when none does: it
 * was sealed with a key not given, or the sealed bytes were altered or moved to another connection.
 */
export function openCredential(keys: Buffer[], sealed: Buffer, connectionId: string): { credential: string; keyIndex: number } | undefined {
  for (const [keyIndex, key] of keys.entries()) {
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, 12))
      decipher.setAAD(Buffer.from(connectionId))
      decipher.setAuthTag(sealed.subarray(12, 28))
      return { credential: Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString('utf8'), keyIndex }
    } catch {
      // The tag does not match under this key (or the bytes are too short to hold one): try the next.
    }
  }
  return undefined
}
