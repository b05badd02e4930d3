/**
 * Scenario of test/postgres-driver.test.ts, run as its own process so that a throw from a driver
 * timer cannot take the test runner down: the backends of two reserved connections are terminated,
 * one idle and one while its queries keep coming, and more queries are sent on both. Prints one
 * JSON line of what happened.
 */
import { createSql } from '../../src/db.ts'

const url = process.env.DATABASE_URL
if (!url) throw new Error('DATABASE_URL is required')

const uncaught: string[] = []
process.on('uncaughtException', error => uncaught.push(String(error)))

const sql = createSql(url, { max: 2, applicationName: 'am-test-terminated-reserve' })
const admin = createSql(url, { max: 1, applicationName: 'am-test-terminated-reserve' })

/** The error code, 'ok', or 'pending' when the driver neither answers nor fails within `ms`. */
function outcome(query: Promise<unknown>, ms = 1000): Promise<string> {
  const pending = Bun.sleep(ms).then(() => 'pending')
  const settled = query.then(
    () => 'ok',
    (error: { code?: string }) => error.code ?? String(error),
  )
  return Promise.race([settled, pending])
}

async function reserveWithPid() {
  const reserved = await sql.reserve()
  const [backend] = await reserved<{ pid: number }[]>`select pg_backend_pid() as pid`
  if (!backend) throw new Error('no backend pid')
  return { reserved, pid: backend.pid }
}

const terminate = (pid: number) => admin`select pg_terminate_backend(${pid})`

// Idle when its backend goes: the queries that follow are small writes deferred to a later tick,
// when the socket is already gone (upstream, a TypeError thrown from that timer).
const idle = await reserveWithPid()
await terminate(idle.pid)
await Bun.sleep(200)
const idleAfter = await Promise.all([outcome(idle.reserved`select 1`), outcome(idle.reserved`select 2`)])

// Busy when its backend goes: small queries back to back, so one always waits in the write buffer
// as the socket closes (upstream, every later write stayed buffered and its query never settled).
const busy = await reserveWithPid()
let sending = true
const seen: string[] = []
const sender = (async () => {
  while (sending) seen.push(await outcome(busy.reserved`select 1`))
})()
await Bun.sleep(50)
await terminate(busy.pid)
const deadline = Date.now() + 1000
while (!seen.some(code => code !== 'ok') && Date.now() < deadline) await Bun.sleep(10)
await Bun.sleep(100)
const busyAfter = await Promise.all([outcome(busy.reserved`select 2`), outcome(busy.reserved`select 3`)])
sending = false
const senderStopped = await outcome(sender, 2000)
const busyDuring = [...new Set(seen.filter(code => code !== 'ok'))]

console.log(
  JSON.stringify({
    uncaught,
    idleAfter,
    busyAnswered: seen.length - seen.filter(code => code !== 'ok').length,
    busyDuring,
    busyAfter,
    senderStopped,
  }),
)
await admin.end()
await Promise.race([sql.end({ timeout: 1 }), Bun.sleep(2000)])
process.exit(0)
