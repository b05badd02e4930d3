/** Which upstream addresses proxy calls may reach: https only, and only public unicast addresses, unless allow-listed. */
import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'
import ipaddr from 'ipaddr.js'

export type Refusal = 'scheme' | 'userinfo' | 'private' | 'unresolvable'

export const refusalMessages: Record<Refusal, string> = {
  scheme: 'must be https (http only for hosts in PROXY_ALLOWED_HOSTS)',
  userinfo: 'must not carry a user name or password',
  private: 'resolves to a private, loopback, link-local or other special-purpose address',
  unresolvable: 'does not resolve',
}

/** Why the URL may not be called, or null when it may (resolving its host name now). */
export async function upstreamRefusal(url: URL, allowedHosts: string[]): Promise<Refusal | null> {
  const host = url.hostname.toLowerCase().replace(/^\[|\]$/g, '')
  // With a port, an IPv6 host keeps its brackets (config.ts), so that `[fd00::5]:8080` is not fd00::5:8080;
  // the port is the one connected to, which a URL leaves out when it is its scheme's own.
  const port = url.port || (url.protocol === 'https:' ? '443' : '80')
  const allowed = allowedHosts.includes(host) || allowedHosts.includes(`${url.hostname.toLowerCase()}:${port}`)
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

// IANA allocates global unicast IPv6 only from 2000::/3; the rest of the space is reserved or special.
const globalUnicastV6 = ipaddr.parseCIDR('2000::/3')

/**
 * Whether an address is anything but public unicast: every range of IANA's IPv4 and IPv6
 * special-purpose registries, by ipaddr.js's table (private, shared, loopback, link-local,
 * documentation, benchmarking, unique local, site local, discard, multicast, reserved), and
 * everything outside 2000::/3. Each IPv6 form that carries an IPv4 address (IPv4-mapped,
 * IPv4-compatible, 6to4, Teredo, NAT64) is refused whatever the IPv4 address: what it reaches is
 * decided by a translator or relay, not by the address. What is not an address is refused too.
 */
export function isInternal(address: string): boolean {
  // Only an address as DNS and URLs write it: ipaddr.js also reads inet_aton's forms (`1.2.3`, `0x7f.1`).
  if (isIP(address) === 0) return true
  let parsed: ipaddr.IPv4 | ipaddr.IPv6
  try {
    parsed = ipaddr.parse(address)
  } catch {
    return true
  }
  if (parsed.kind() === 'ipv6' && !parsed.match(globalUnicastV6)) return true
  return parsed.range() !== 'unicast'
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('timeout')), ms).unref())])
}
