/** Which upstream addresses proxy calls may reach: https only, and no private, loopback or link-local address, unless allow-listed. */
import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'

export type Refusal = 'scheme' | 'userinfo' | 'private' | 'unresolvable'

export const refusalMessages: Record<Refusal, string> = {
  scheme: 'must be https (http only for hosts in PROXY_ALLOWED_HOSTS)',
  userinfo: 'must not carry a user name or password',
  private: 'resolves to a private, loopback or link-local address',
  unresolvable: 'does not resolve',
}

/** Why the URL may not be called, or null when it may (resolving its host name now). */
export async function upstreamRefusal(url: URL, allowedHosts: string[]): Promise<Refusal | null> {
  const host = url.hostname.toLowerCase().replace(/^\[|\]$/g, '')
  const allowed = allowedHosts.includes(host) || allowedHosts.includes(`${host}:${url.port}`)
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && allowed)) return 'scheme'
  if (url.username || url.password) return 'userinfo'
  if (allowed) return null
  let addresses: string[]
  try {
    addresses = isIP(host) ? [host] : (await withTimeout(lookup(host, { all: true, verbatim: true }), 5000)).map(entry => entry.address)
  } catch {
    return 'unresolvable'
  }
  return addresses.length === 0 ? 'unresolvable' : addresses.some(isInternal) ? 'private' : null
}

/** Loopback, private, link-local, shared, unspecified, multicast and reserved ranges, v4 and v6. */
export function isInternal(address: string): boolean {
  const mapped = /^::(?:ffff:)?(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  if (mapped) return isInternal(mapped[1]!)
  // The same IPv4-mapped or -compatible address in hex, as URL parsing writes it: ::ffff:7f00:1.
  const hex = /^::(?:ffff:)?([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(address)
  if (hex) {
    const high = parseInt(hex[1]!, 16)
    const low = parseInt(hex[2]!, 16)
    return isInternal(`${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`)
  }
  if (isIP(address) === 4) {
    const [a, b] = address.split('.').map(Number) as [number, number]
    return (
      a === 0 ||
      a === 10 ||
      a === 127 ||
      (a === 100 && b >= 64 && b <= 127) ||
      (a === 169 && b === 254) ||
      (a === 172 && b >= 16 && b <= 31) ||
      (a === 192 && b === 168) ||
      (a === 192 && b === 0) ||
      (a === 198 && (b === 18 || b === 19)) ||
      a >= 224
    )
  }
  const v6 = address.toLowerCase()
  return (
    v6 === '::' ||
    v6 === '::1' ||
    /^f[cd]/.test(v6) ||
    /^fe[89ab]/.test(v6) ||
    v6.startsWith('ff') ||
    v6.startsWith('64:ff9b:') ||
    v6.startsWith('2001:db8')
  )
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('timeout')), ms).unref())])
}
