/**
 * Scenario of test/postgres-driver.test.ts, run as its own process so that an unhandled rejection
 * cannot take the test runner down: a proxy in front of PostgreSQL closes a new connection's socket
 * while the driver fetches the array types (what each new connection runs after its startup, as
 * when the server goes away just after accepting it), and queries are sent before and after.
 * Prints one JSON line of what happened.
 */
import { connect, createServer, type Socket } from 'node:net'
import { createSql } from '../../src/db.ts'

const url = process.env.DATABASE_URL
if (!url) throw new Error('DATABASE_URL is required')
const target = new URL(url)

const unhandled: string[] = []
process.on('unhandledRejection', error => unhandled.push(String(error)))

// Passes bytes both ways, except that the first client message asking for the array types closes
// both sockets before it reaches the server.
let cuts = 0
const sockets = new Set<Socket>()
const proxy = createServer(client => {
  const upstream = connect(Number(target.port || 5432), target.hostname)
  for (const socket of [client, upstream]) {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => socket.destroy())
  }
  client.on('data', chunk => {
    if (cuts === 0 && chunk.toString('latin1').includes('typarray')) {
      cuts++
      client.destroy()
      upstream.destroy()
      return
    }
    upstream.write(chunk)
  })
  upstream.on('data', chunk => client.write(chunk))
  client.on('close', () => upstream.destroy())
  upstream.on('close', () => client.destroy())
})
await new Promise<void>(resolve => proxy.listen(0, '127.0.0.1', resolve))
const address = proxy.address()
if (!address || typeof address === 'string') throw new Error('the proxy has no port')
const proxied = new URL(url)
proxied.hostname = '127.0.0.1'
proxied.port = String(address.port)

/** The answer, the error code, or 'pending' when the driver neither answers nor fails within `ms`. */
function outcome(query: Promise<{ x: number }[]>, ms = 5000): Promise<string> {
  const pending = Bun.sleep(ms).then(() => 'pending')
  const settled = query.then(
    rows => String(rows[0]?.x),
    (error: { code?: string }) => error.code ?? String(error),
  )
  return Promise.race([settled, pending])
}

const sql = createSql(proxied.toString(), { max: 1, applicationName: 'am-test-types-cut' })
const first = await outcome(sql`select 1 as x`)
const second = await outcome(sql`select 2 as x`)
await Promise.race([sql.end(), Bun.sleep(2000)])
for (const socket of sockets) socket.destroy()
proxy.close()
// Unhandled rejections surface a tick after they happen.
await Bun.sleep(100)
console.log(JSON.stringify({ cuts, unhandled, first, second }))
process.exit(0)
