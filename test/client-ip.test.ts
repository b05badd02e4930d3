/** The caller's address behind trusted proxies, read by a real server from real sockets. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { clientIpResolver } from '../src/http/client-ip.ts'

const servers: ReturnType<typeof Bun.serve>[] = []

/** A server on 127.0.0.1 that answers each request with the address the resolver gives it. */
function serving(trustedProxies: string[]) {
  const resolve = clientIpResolver(trustedProxies)
  const server = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: (request, server) => new Response(resolve(server, request)) })
  servers.push(server)
  return (forwardedFor?: string) =>
    fetch(server.url, { headers: forwardedFor === undefined ? {} : { 'x-forwarded-for': forwardedFor } }).then(r => r.text())
}

afterAll(() => {
  for (const server of servers) server.stop(true)
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

  test('garbage passed on by a trusted proxy ends the walk at the last known address', async () => {
    expect(await behindTwo('203.0.113.5, bogus, 10.1.2.3')).toBe('10.1.2.3')
    expect(await behindLocal('bogus')).toBe('127.0.0.1')
    expect(await behindLocal('')).toBe('127.0.0.1')
  })
})
