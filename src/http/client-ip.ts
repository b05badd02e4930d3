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

/** A forwarded hop as some proxies write it, with a port (`203.0.113.5:4711`, `[2001:db8::7]:443`), as the address. */
function hopAddress(hop: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(hop)
  if (bracketed) return plain(bracketed[1]!)
  const withPort = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(hop)
  return plain(withPort ? withPort[1]! : hop)
}

/**
 * What a per-IP limit counts by: an IPv4 address, or the /64 of an IPv6 one (one subscriber's
 * network: its hosts pick any address in it, so counting by /128 would be no limit at all).
 */
export function addressBucket(address: string): string {
  if (isIP(address) !== 6) return address
  let text = address.toLowerCase().replace(/%.*$/, '')
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text)
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number) as [number, number, number, number]
    text = `${text.slice(0, v4.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const [head, tail] = text.split('::') as [string, string | undefined]
  const left = head ? head.split(':') : []
  const right = tail ? tail.split(':') : []
  const groups = (tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right]).map(group =>
    Number.parseInt(group, 16),
  )
  // An IPv4 address however it is written as IPv6 (`::ffff:7f00:1` too): counted as that address.
  if (groups.slice(0, 5).every(group => group === 0) && groups[5] === 0xffff) {
    const [high, low] = [groups[6]!, groups[7]!]
    return `${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`
  }
  return `${groups
    .slice(0, 4)
    .map(group => group.toString(16))
    .join(':')}::/64`
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
    if (family === 6 && coversIpv4(address, bits)) {
      // Checks map IPv4 addresses into IPv6 rules: `::ffff:10.0.0.0/8` would trust every IPv4 client.
      throw new Error(`"${entry}" covers IPv4 addresses; write IPv4 addresses and ranges as IPv4`)
    }
    if (bits === undefined) list.addAddress(address, type)
    else list.addSubnet(address, Number(bits), type)
  }
  return list
}

/** Whether an IPv6 address or range is, or takes in, IPv4-mapped addresses (`::ffff:a.b.c.d`). */
function coversIpv4(address: string, bits: string | undefined): boolean {
  const one = new BlockList()
  one.addSubnet(address, bits === undefined ? 128 : Number(bits), 'ipv6')
  return one.check('::ffff:0.0.0.0', 'ipv6') || one.check('::ffff:255.255.255.255', 'ipv6') || /^(::|(0{1,4}:){5})ffff:/i.test(address)
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
      const hop = hopAddress(hops[i]!.trim())
      // Not an address: a trusted proxy passed on something it should not have; the last proxy
      // known is the best answer, never the garbage (which would be a fresh bucket per request).
      if (isIP(hop) === 0) return client
      client = hop
      if (!isTrusted(hop)) return hop
    }
    return client
  }
}
