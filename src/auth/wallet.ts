/** Wallet addresses: `0x` and 40 hex digits; mixed case must carry a valid EIP-55 checksum. */
import { keccak_256 } from '@noble/hashes/sha3.js'

/**
 * The EIP-55 form of a valid address, or null when it is malformed or its mixed case is wrong.
 *
 * @example
 * checksumAddress('0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed') // '0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed'
 */
export function checksumAddress(address: string): string | null {
  if (!/^0x[0-9a-fA-F]{40}$/.test(address)) return null
  const hex = address.slice(2)
  const lower = hex.toLowerCase()
  const hash = Buffer.from(keccak_256(new TextEncoder().encode(lower))).toString('hex')
  let out = ''
  for (let i = 0; i < 40; i++) {
    const char = lower[i]!
    out += parseInt(hash[i]!, 16) >= 8 ? char.toUpperCase() : char
  }
  const mixed = hex !== lower && hex !== hex.toUpperCase()
  if (mixed && out !== hex) return null
  return '0x' + out
}
