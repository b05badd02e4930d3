/** Which upstream addresses proxy calls may reach: IANA's special-purpose registries, sampled range by range. */
import { describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import ipaddr from 'ipaddr.js'
import { isInternal, upstreamRefusal } from '../src/connections/address-policy.ts'
import { loadConfig } from '../src/config.ts'

// Written out from IANA's IPv4 and IPv6 Special-Purpose Address Registries (and the multicast
// blocks), not from the library's table: these are what the library is checked against.
const specialV4 = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.0.0/29',
  '192.0.0.8/32',
  '192.0.0.9/32',
  '192.0.0.10/32',
  '192.0.0.170/32',
  '192.0.0.171/32',
  '192.0.2.0/24',
  '192.31.196.0/24',
  '192.52.193.0/24',
  '192.88.99.0/24',
  '192.168.0.0/16',
  '192.175.48.0/24',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '224.0.0.0/4',
  '240.0.0.0/4',
  '255.255.255.255/32',
]
const specialV6 = [
  '::/128',
  '::1/128',
  // IPv4-compatible (deprecated, RFC 4291) and the rest of ::/8
  '::/96',
  '::ffff:0:0/96',
  '::ffff:0:0:0/96',
  '64:ff9b::/96',
  '64:ff9b:1::/48',
  '100::/64',
  '100:0:0:1::/64',
  '2001::/23',
  '2001::/32',
  '2001:1::1/128',
  '2001:1::2/128',
  '2001:1::3/128',
  '2001:2::/48',
  '2001:3::/32',
  '2001:4:112::/48',
  '2001:10::/28',
  '2001:20::/28',
  '2001:30::/28',
  '2001:db8::/32',
  '2002::/16',
  '2620:4f:8000::/48',
  '3fff::/20',
  '5f00::/16',
  'fc00::/7',
  'fe80::/10',
  'fec0::/10',
  'ff00::/8',
]
// Public unicast blocks of real networks (Google, Cloudflare, Fastly, AWS, and so on).
const publicV4 = ['8.8.8.0/24', '1.1.1.0/24', '151.101.0.0/16', '52.0.0.0/11', '93.184.216.0/24', '185.199.108.0/22']
const publicV6 = ['2606:4700::/32', '2a00:1450::/32', '2600:1f00::/24', '2400:cb00::/32', '2a03:2880::/32', '2620:0:860::/46']

/** The first and last address of a CIDR range and `count` random ones in it. */
function sample(cidr: string, count = 40): string[] {
  const [network, bits] = ipaddr.parseCIDR(cidr)
  const bytes = network.toByteArray()
  const pick = (fill: (i: number) => number) =>
    ipaddr
      .fromByteArray(
        bytes.map((byte, i) => {
          const fixed = Math.max(0, Math.min(8, bits - i * 8))
          const mask = (0xff << (8 - fixed)) & 0xff
          return (byte & mask) | (fill(i) & ~mask & 0xff)
        }),
      )
      .toString()
  const random = randomBytes(bytes.length * count)
  return [pick(() => 0), pick(() => 0xff), ...Array.from({ length: count }, (_, n) => pick(i => random[n * bytes.length + i]!))]
}

/** The ways one IPv6 address can be written: compressed, in full, upper case, and with its last 32 bits dotted. */
function spellings(address: string): string[] {
  const parsed = ipaddr.parse(address)
  if (parsed.kind() === 'ipv4') return [address]
  const parts = (parsed as ipaddr.IPv6).parts
  const dotted = `${parts
    .slice(0, 6)
    .map(p => p.toString(16))
    .join(':')}:${parts[6]! >> 8}.${parts[6]! & 255}.${parts[7]! >> 8}.${parts[7]! & 255}`
  return [address, parsed.toNormalizedString(), address.toUpperCase(), dotted]
}

describe('internal addresses', () => {
  test.each(specialV4)('every address sampled from %s is internal', cidr => {
    for (const address of sample(cidr)) expect({ address, internal: isInternal(address) }).toEqual({ address, internal: true })
  })

  test.each(specialV6)('every address sampled from %s is internal, however it is written', cidr => {
    for (const address of sample(cidr)) {
      for (const spelling of spellings(address)) expect({ spelling, internal: isInternal(spelling) }).toEqual({ spelling, internal: true })
    }
  })

  test('IPv6 that carries a public IPv4 address is internal in every form: mapped, compatible, 6to4, Teredo, NAT64', () => {
    for (const address of [
      '::ffff:8.8.8.8',
      '::ffff:808:808',
      '0:0:0:0:0:ffff:808:808',
      '::8.8.8.8',
      '::ffff:0:8.8.8.8',
      '2002:808:808::1',
      '2001:0:4136:e378:8000:63bf:f7f7:f7f7',
      '64:ff9b::8.8.8.8',
      '64:ff9b::808:808',
      '64:ff9b:1:808:808::',
    ]) {
      expect({ address, internal: isInternal(address) }).toEqual({ address, internal: true })
    }
  })

  test('what is not an address as DNS and URLs write one is internal (refused), not waved through', () => {
    for (const text of ['', 'localhost', '1.2.3', '8.8.2056', '0x8.8.8.8', '::g', '1.2.3.4.5', '[::1]']) expect(isInternal(text)).toBe(true)
  })

  test.each([...publicV4, ...publicV6])('addresses sampled from the public block %s are not internal', cidr => {
    for (const address of sample(cidr)) expect({ address, internal: isInternal(address) }).toEqual({ address, internal: false })
  })
})

describe('upstream refusals', () => {
  test('a literal address in a special range is refused as private; PROXY_ALLOWED_HOSTS still opens it', async () => {
    for (const host of ['[::ffff:7f00:1]', '[2002:7f00:1::1]', '[2001::1]', '[fec0::1]', '[100::1]', '[64:ff9b::a00:1]', '100.64.0.1']) {
      expect(await upstreamRefusal(new URL(`https://${host}/api`), [])).toBe('private')
      // As config.ts reads PROXY_ALLOWED_HOSTS: the host as a URL writes it, without brackets.
      const listed = new URL(`http://${host}`).hostname.replace(/^\[|\]$/g, '')
      expect(await upstreamRefusal(new URL(`http://${host}/api`), [listed])).toBeNull()
    }
    expect(await upstreamRefusal(new URL('https://[2606:4700::1111]/api'), [])).toBeNull()
    expect(await upstreamRefusal(new URL('https://1.1.1.1/api'), [])).toBeNull()
  })

  test('a host listed with its scheme’s own port opens it there, though URLs leave that port out', async () => {
    const listed = loadConfig({ PROXY_ALLOWED_HOSTS: 'localhost:80,127.0.0.1:443,[::1]:80' }).proxyAllowedHosts
    for (const url of ['http://localhost/api', 'http://localhost:80/api', 'https://127.0.0.1/api', 'https://127.0.0.1:443/api', 'http://[::1]/api']) {
      expect({ url, refusal: await upstreamRefusal(new URL(url), listed) }).toEqual({ url, refusal: null })
    }
    for (const url of ['http://localhost:8080/api', 'https://localhost/api', 'http://127.0.0.1/api', 'https://[::1]/api']) {
      expect({ url, refused: (await upstreamRefusal(new URL(url), listed)) !== null }).toEqual({ url, refused: true })
    }
  })

  test('an IPv6 address listed with a port opens it on that port, not the address its text spells without brackets', async () => {
    const listed = loadConfig({ PROXY_ALLOWED_HOSTS: '[fd00::5]:8080' }).proxyAllowedHosts
    expect(await upstreamRefusal(new URL('http://[fd00::5]:8080/api'), listed)).toBeNull()
    expect(await upstreamRefusal(new URL('http://[fd00::5]:9090/api'), listed)).toBe('scheme')
    // fd00::5:8080 is another address, on every port: the entry never named it.
    expect(await upstreamRefusal(new URL('https://[fd00::5:8080]/api'), listed)).toBe('private')
    expect(await upstreamRefusal(new URL('http://[fd00::5:8080]:22/api'), listed)).toBe('scheme')
    // And that address listed opens itself on every port, not fd00::5 on port 8080.
    const other = loadConfig({ PROXY_ALLOWED_HOSTS: 'fd00::5:8080' }).proxyAllowedHosts
    expect(await upstreamRefusal(new URL('http://[fd00::5:8080]:22/api'), other)).toBeNull()
    expect(await upstreamRefusal(new URL('https://[fd00::5]:8080/api'), other)).toBe('private')
  })

  test('an entry matches however its address is written: IPv6 uncompressed or with leading zeros, a port with them', async () => {
    const listed = loadConfig({ PROXY_ALLOWED_HOSTS: '[fd00:0:0::0005]:08080,fd00:0000::7,FD00::8' }).proxyAllowedHosts
    expect(await upstreamRefusal(new URL('http://[fd00::5]:8080/api'), listed)).toBeNull()
    expect(await upstreamRefusal(new URL('http://[fd00::7]:22/api'), listed)).toBeNull()
    expect(await upstreamRefusal(new URL('http://[fd00::8]/api'), listed)).toBeNull()
    expect(await upstreamRefusal(new URL('http://[fd00::6]:8080/api'), listed)).toBe('scheme')
  })
})
