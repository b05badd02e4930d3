/** Connected-account credentials sealed with AES-256-GCM, bound to their connection id. */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'

/**
 * @example
 * const sealed = sealCredential(key, 'token-123', connectionId)
 * openCredential(key, sealed, connectionId) // 'token-123'
 */
export function sealCredential(key: Buffer, plaintext: string, connectionId: string): Buffer {
  const nonce = randomBytes(12)
  const cipher = createCipheriv('aes-256-gcm', key, nonce)
  cipher.setAAD(Buffer.from(connectionId))
  const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()])
  return Buffer.concat([nonce, cipher.getAuthTag(), ciphertext])
}

/** Throws when the key is wrong or the sealed bytes were altered or moved to another connection. */
export function openCredential(key: Buffer, sealed: Buffer, connectionId: string): string {
  const decipher = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, 12))
  decipher.setAAD(Buffer.from(connectionId))
  decipher.setAuthTag(sealed.subarray(12, 28))
  return Buffer.concat([decipher.update(sealed.subarray(28)), decipher.final()]).toString('utf8')
}
