/**
 * The caller's address, for per-IP limits where there is no credential. Behind reverse proxies or
 * load balancers (TRUSTED_PROXIES) it is read from X-Forwarded-For, right to left: each trusted hop
 * appends the address it got the request from, so the first address that is not a trusted proxy is
 * the client, and whatever the client wrote into the header itself (to its left) is never reached.
 */
import { BlockList, isIP } from 'node:net'
import type { Server } from 'bun'

export type ClientIp = (server: Server<unknown> | null | undefined, request: Request) => string

/** An IPv4 address written as IPv6 (`::ffff:10.0.0.1`, as a dual-stack socket reports it) as IPv4. */
function plain(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  return mapped ? mapped[1]! : address
}

/**
 * Parses TRUSTED_PROXIES entries (addresses or CIDR ranges, IPv4 or IPv6) into a list to check
 * addresses against; throws naming the first entry that is neither.
 */
export function trustedProxyList(entries: string[]): BlockList {
  const list = new BlockList()
  for (const entry of entries) {
    const [address = '', bits, extra] = entry.split('/')
    const family = isIP(address)
    const max = family === 4 ? 32 : 128
    if (family === 0 || extra !== undefined || (bits !== undefined && !(/^\d{1,3}$/.test(bits) && Number(bits) <= max))) {
      throw new Error(`"${entry}" is not an IP address or CIDR range`)
    }
    const type = family === 4 ? 'ipv4' : 'ipv6'
    if (bits === undefined) list.addAddress(address, type)
    else list.addSubnet(address, Number(bits), type)
  }
  return list
}

/** The resolver for a deployment's proxies (none: the socket's address is the client's). */
export function clientIpResolver(trustedProxies: string[]): ClientIp {
  const trusted = trustedProxies.length > 0 ? trustedProxyList(trustedProxies) : undefined
  const isTrusted = (address: string) => {
    const family = isIP(address)
    return family !== 0 && trusted!.check(address, family === 4 ? 'ipv4' : 'ipv6')
  }
  return (server, request) => {
    const peer = server?.requestIP(request)?.address
    if (peer === undefined) return 'local'
    let client = plain(peer)
    if (!trusted || !isTrusted(client)) return client
    const forwarded = request.headers.get('x-forwarded-for')
    if (!forwarded) return client
    const hops = forwarded.split(',')
    for (let i = hops.length - 1; i >= 0; i--) {
      const hop = plain(hops[i]!.trim())
      // Not an address: a trusted proxy passed on something it should not have; the last proxy
      // known is the best answer, never the garbage (which would be a fresh bucket per request).
      if (isIP(hop) === 0) return client
      client = hop
      if (!isTrusted(hop)) return hop
    }
    return client
  }
}
