/** The caller's address behind trusted proxies, read by a real server from real sockets. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { addressBucket, clientIpResolver, trustedProxyList } from '../src/http/client-ip.ts'

const servers: ReturnType<typeof Bun.serve>[] = []

/** A server on 127.0.0.1 that answers each request with the address the resolver gives it. */
function serving(trustedProxies: string[]) {
  const resolve = clientIpResolver(trustedProxies)
  const server = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: (request, server) => new Response(resolve(server, request)) })
  servers.push(server)
  return (forwardedFor?: string) =>
    fetch(server.url, { headers: forwardedFor === undefined ? {} : { 'x-forwarded-for': forwardedFor } }).then(r => r.text())
}

afterAll(async () => {
  await Promise.all(servers.map(server => server.stop(true)))
})

describe('the client address', () => {
  let direct: ReturnType<typeof serving>
  let behindLocal: ReturnType<typeof serving>
  let behindTwo: ReturnType<typeof serving>
  beforeAll(() => {
    direct = serving([])
    behindLocal = serving(['127.0.0.0/8'])
    behindTwo = serving(['127.0.0.1', '10.0.0.0/8'])
  })

  test('with no trusted proxies it is the socket address; X-Forwarded-For is not believed', async () => {
    expect(await direct()).toBe('127.0.0.1')
    expect(await direct('203.0.113.5')).toBe('127.0.0.1')
  })

  test('from a trusted proxy it is the address that proxy appended', async () => {
    expect(await behindLocal('203.0.113.5')).toBe('203.0.113.5')
    expect(await behindLocal(' 2001:db8::7 ')).toBe('2001:db8::7')
    expect(await behindLocal('::ffff:203.0.113.9')).toBe('203.0.113.9')
    // No header: the proxy itself is all there is to go by.
    expect(await behindLocal()).toBe('127.0.0.1')
  })

  test('what a client writes into the header itself is never taken for its address', async () => {
    // The client sent "X-Forwarded-For: 198.51.100.1"; the proxy appended the address it saw.
    expect(await behindLocal('198.51.100.1, 203.0.113.5')).toBe('203.0.113.5')
    expect(await behindLocal('not-an-address, 203.0.113.5')).toBe('203.0.113.5')
  })

  test('through a chain of trusted proxies it is the first untrusted hop from the right', async () => {
    expect(await behindTwo('203.0.113.5, 10.1.2.3')).toBe('203.0.113.5')
    expect(await behindTwo('198.51.100.1, 203.0.113.5, 10.1.2.3, 10.9.9.9')).toBe('203.0.113.5')
    // Every hop trusted: the leftmost is the closest thing to the client.
    expect(await behindTwo('10.0.0.4, 10.1.2.3')).toBe('10.0.0.4')
  })

  test('hops written with a port, as some proxies write them, are read as their address', async () => {
    expect(await behindLocal('203.0.113.5:4711')).toBe('203.0.113.5')
    expect(await behindLocal('[2001:db8::7]:443')).toBe('2001:db8::7')
    expect(await behindLocal('[2001:db8::8]')).toBe('2001:db8::8')
    expect(await behindTwo('203.0.113.5, 10.1.2.3:80')).toBe('203.0.113.5')
  })

  test('garbage passed on by a trusted proxy ends the walk at the last known address', async () => {
    expect(await behindTwo('203.0.113.5, bogus, 10.1.2.3')).toBe('10.1.2.3')
    expect(await behindLocal('bogus')).toBe('127.0.0.1')
    expect(await behindLocal('')).toBe('127.0.0.1')
  })
})

describe('what a per-IP limit counts by', () => {
  test('an IPv4 address is itself; an IPv6 address is its /64, however it is written', () => {
    expect(addressBucket('203.0.113.5')).toBe('203.0.113.5')
    expect(addressBucket('2001:db8:1:2:3:4:5:6')).toBe('2001:db8:1:2::/64')
    expect(addressBucket('2001:DB8:1:2::ffff')).toBe('2001:db8:1:2::/64')
    expect(addressBucket('2001:db8::1')).toBe('2001:db8:0:0::/64')
    expect(addressBucket('64:ff9b::192.0.2.1')).toBe('64:ff9b:0:0::/64')
    expect(addressBucket('fe80::1%eth0')).toBe('fe80:0:0:0::/64')
    expect(addressBucket('local')).toBe('local')
    // An IPv4 address written as IPv6 in any form is that address, not the /64 every such one shares.
    expect(addressBucket('::ffff:7f00:1')).toBe('127.0.0.1')
    expect(addressBucket('0:0:0:0:0:FFFF:CB00:7105')).toBe('203.0.113.5')
    expect(addressBucket('::ffff:203.0.113.5')).toBe('203.0.113.5')
  })
})

describe('TRUSTED_PROXIES entries', () => {
  test.each(['::ffff:10.0.0.0/8', '::ffff:10.0.0.1', '::ffff:a00:0/104', '0:0:0:0:0:ffff:10.0.0.1', '::/8', '::/0'])(
    '%p takes in IPv4 addresses and is refused (IPv4 is written as IPv4)',
    entry => {
      expect(() => trustedProxyList([entry])).toThrow('covers IPv4 addresses')
    },
  )

  test('IPv6 addresses and ranges of IPv6 proxies are taken', () => {
    const list = trustedProxyList(['fd00::/8', '2001:db8::/32', '::1'])
    expect(list.check('fd12::1', 'ipv6')).toBe(true)
    expect(list.check('203.0.113.5', 'ipv4')).toBe(false)
  })
})
