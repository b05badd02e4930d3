import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { createServer } from 'node:net'
import { join } from 'node:path'
import postgres from 'postgres'
import { createSql, isConnectionError, isTransientFailure, silenceGraceMs, type Sql } from '../src/db.ts'
import { adminUrl } from './helpers/database.ts'
import { startHeldProxy } from './helpers/held-proxy.ts'
import { postgresBinaries, startPostgresServer, type PostgresServer } from './helpers/postgres-server.ts'
import { freePort } from './helpers/ports.ts'
import { exitWithin, processGroup, projectRoot } from './helpers/processes.ts'
import { until } from './helpers/until.ts'

// postgres.js 3.4.9 as patched at install (patches/README.md): a connection whose socket closes
// with small writes buffered neither crashes the process nor stays unable to reconnect; one whose
// socket closes with a statement in flight neither holds up `end()` nor fails its next statement,
// nor one that closes while it fetches the array types; a startup closed without an error is tried
// again only until connect_timeout; a transaction rolled back at its COMMIT fails; a connection
// whose server falls silent is given up after silence_timeout; a connection whose server refuses
// writes (read-only), or reports turning read-only after it opened, is left once idle; a URL's host
// may be an IPv6 literal in brackets.

const { start, killAll } = processGroup()
const servers: PostgresServer[] = []
const pools: Sql[] = []

afterAll(async () => {
  await Promise.all(pools.map(sql => Promise.race([sql.end({ timeout: 0 }), Bun.sleep(2000)])))
  await Promise.all(servers.map(server => server.stop()))
  await killAll()
})

const hasServerBinaries = postgresBinaries() !== null
if (!hasServerBinaries) console.warn('postgres-driver: skipping the restart test, initdb and pg_ctl are missing')

/**
 * Whether the server reports in_hot_standby to its sessions (`off` on a primary): PostgreSQL 14 and
 * later do, 13 does not, and there a report of `on` with none before it is not a turn (patches/README.md).
 */
const reportsHotStandby = await (async () => {
  const sql = createSql(adminUrl, { max: 1, applicationName: 'am-test-reports-hot-standby' })
  try {
    await sql`select 1`
    return sql.parameters.in_hot_standby !== undefined
  } finally {
    await sql.end()
  }
})()

/** Settles within `ms` with whether the query answered; a query the driver never settles is false. */
function answers(query: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([
    query.then(
      () => true,
      () => false,
    ),
    Bun.sleep(ms).then(() => false),
  ])
}

describe('the PostgreSQL driver when a connection closes under it', () => {
  test('a transaction whose COMMIT completes as ROLLBACK fails, rather than answering as if committed', async () => {
    const sql = createSql(adminUrl, { max: 1, applicationName: 'am-test-commit-rollback' })
    pools.push(sql)
    const table = `commit_probe_${randomBytes(4).toString('hex')}`
    await sql`create table ${sql(table)} (x int)`
    try {
      // The connection prepares its COMMIT in a first transaction; the second drops every prepared
      // statement (as a server connection PgBouncer swapped in would lack them): the COMMIT fails,
      // the driver prepares it again and retries it inside the aborted transaction.
      await sql.begin(tx => tx`select 1`)
      const failed = await sql
        .begin(async tx => {
          await tx`insert into ${sql(table)} values (1)`
          await tx.unsafe('deallocate all')
        })
        .then(
          () => null,
          (error: { code?: string }) => error.code,
        )
      expect(failed).toBe('COMMIT_ROLLED_BACK')
      // Nothing committed: the request that ran it may be sent again (503).
      expect(isTransientFailure({ code: failed })).toBe(true)
      expect(await sql`select x from ${sql(table)}`).toHaveLength(0)
      // The connection serves on, and a transaction that commits still answers.
      expect(await sql.begin(async tx => (await tx`insert into ${sql(table)} values (2) returning x`)[0]!.x)).toBe(2)
    } finally {
      await sql`drop table ${sql(table)}`
    }
  })

  test('a reserved connection whose backend is terminated fails its queries, and the process lives on', async () => {
    const scenario = start([join(projectRoot, 'test', 'postgres-driver', 'terminated-reserve.ts')], {
      PATH: process.env.PATH ?? '',
      DATABASE_URL: adminUrl,
    })
    expect(await exitWithin(scenario.proc, 15_000)).toBe(0)
    const stderr = await scenario.stderr
    expect(stderr).not.toContain('socket.write')
    const result = JSON.parse(await scenario.stdout) as {
      uncaught: string[]
      idleAfter: string[]
      busyAnswered: number
      busyDuring: string[]
      busyAfter: string[]
      senderStopped: string
    }
    expect(result.uncaught).toEqual([])
    expect(result.idleAfter).toEqual(['CONNECTION_CLOSED', 'CONNECTION_CLOSED'])
    expect(result.busyAnswered).toBeGreaterThan(0)
    expect(result.busyDuring.length).toBeGreaterThan(0)
    expect(result.busyDuring.filter(code => !isConnectionError({ code }))).toEqual([])
    expect(result.busyAfter).toEqual(['CONNECTION_CLOSED', 'CONNECTION_CLOSED'])
    expect(result.senderStopped).toBe('ok')
  }, 20_000)

  test('a connection closed while it fetches the array types neither crashes the process nor fails its query', async () => {
    const scenario = start([join(projectRoot, 'test', 'postgres-driver', 'types-cut.ts')], {
      PATH: process.env.PATH ?? '',
      DATABASE_URL: adminUrl,
    })
    expect(await exitWithin(scenario.proc, 15_000)).toBe(0)
    const result = JSON.parse(await scenario.stdout) as { cuts: number; unhandled: string[]; first: string; second: string }
    expect(result.cuts).toBe(1)
    // Unpatched (with the close failing the fetch), an unhandled CONNECTION_CLOSED: exit 1 in the app.
    expect(result.unhandled).toEqual([])
    // The reconnect runs the query that asked for the connection.
    expect([result.first, result.second]).toEqual(['1', '2'])
  }, 20_000)

  /**
   * A pool of one connection whose backend is terminated while it runs a statement (as in a restart,
   * pg_ctl -m fast: the server sends 57P01 and closes the socket); `before` runs just before.
   */
  async function terminatedMidStatement(before: (sql: Sql) => void = () => {}) {
    const applicationName = `am-test-mid-${randomBytes(4).toString('hex')}`
    const sql = createSql(adminUrl, { max: 1, applicationName })
    const admin = createSql(adminUrl, { max: 1, applicationName: `${applicationName}-admin` })
    pools.push(sql, admin)
    expect(await answers(sql`select 1`, 5000)).toBe(true)
    const inFlight = sql`select pg_sleep(30)`.then(
      () => 'ok',
      (error: { code?: string }) => error.code ?? String(error),
    )
    await until(async () => {
      const rows = await admin`
        select 1 from pg_stat_activity
        where application_name = ${applicationName} and state = 'active' and query like '%pg_sleep%'`
      return rows.length === 1
    }, 5000)
    before(sql)
    await admin`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${applicationName}`
    return { sql, inFlight: await inFlight }
  }

  const endsWithin = (sql: Sql, ms: number) => Promise.race([sql.end().then(() => true), Bun.sleep(ms).then(() => false)])

  test('a pool whose statement was in flight when its backend went ends at once, without a timeout', async () => {
    const { sql, inFlight } = await terminatedMidStatement()
    expect(isConnectionError({ code: inFlight })).toBe(true)
    // Nothing ran on the connection since: upstream it kept the failed statement as in flight, so
    // end() waited for its ReadyForQuery, which never comes (only a timeout, if given, ended it).
    expect(await endsWithin(sql, 2000)).toBe(true)
  }, 15_000)

  test('an end() waiting for a statement in flight is done when its backend goes', async () => {
    let ended: Promise<boolean> | undefined
    const { inFlight } = await terminatedMidStatement(sql => {
      ended = endsWithin(sql, 3000)
    })
    expect(isConnectionError({ code: inFlight })).toBe(true)
    // Upstream only ReadyForQuery or a terminate() (end's timeout) settled it, never the close.
    expect(await ended).toBe(true)
  }, 15_000)

  test('the first statement on a connection reconnected after its backend went mid-statement answers', async () => {
    const { sql, inFlight } = await terminatedMidStatement()
    expect(isConnectionError({ code: inFlight })).toBe(true)
    // Upstream, the reconnected socket's first ReadyForQuery settled the stale statement with its
    // stale 57P01 and failed this one, which the server never saw, with that error.
    const next = await sql<{ x: number }[]>`select 1 as x`.then(
      rows => rows[0]?.x,
      (error: { code?: string; message?: string }) => `${error.code}: ${error.message}`,
    )
    expect(next).toBe(1)
  }, 15_000)

  test('a server that closes every connection cleanly at startup fails the query after connect_timeout, trying again backing off', async () => {
    // A proxy whose server is away: it accepts each connection and closes it without a word.
    let accepted = 0
    const proxy = createServer(socket => (accepted++, socket.end())).listen(0, '127.0.0.1')
    await new Promise(resolve => proxy.once('listening', resolve))
    const sql = createSql(`postgres://nobody@127.0.0.1:${(proxy.address() as { port: number }).port}/none`, { max: 1 })
    pools.push(sql)
    try {
      // Upstream the query never settled, the driver reconnecting at once for ever.
      const outcome = await Promise.race([
        sql`select 1`.then(
          () => 'answered',
          (error: { code?: string }) => error.code,
        ),
        Bun.sleep(15_000).then(() => 'never settled'),
      ])
      expect(outcome).toBe('CONNECTION_CLOSED')
      // In its 5 s it tried again about every 0.5 s (the pool's backoff), not thousands of times.
      expect(accepted).toBeGreaterThan(3)
      expect(accepted).toBeLessThan(50)
    } finally {
      proxy.close()
    }
  }, 30_000)

  test.skipIf(!hasServerBinaries)(
    'after a restart under load the pool answers within 2 s of the server accepting connections',
    async () => {
      const server = await startPostgresServer()
      servers.push(server)
      // The app's pool settings (connect_timeout 5 s) with one connection: every query pipelines on
      // it, so no second, healthy connection can answer for a broken one.
      const sql = createSql(server.url(), { max: 1, applicationName: 'am-test-restart' })
      pools.push(sql)
      expect(await answers(sql`select 1`, 5000)).toBe(true)

      let loading = true
      let answered = 0
      const workers = Array.from({ length: 8 }, async () => {
        while (loading) if (await answers(sql`select 1`, 1000)) answered++
      })
      try {
        // Unpatched, a restart breaks the connection only when a write was buffered as it closed
        // (most restarts under this load): three in a row leave little room for a lucky pass.
        for (let restart = 1; restart <= 3; restart++) {
          await Bun.sleep(200)
          const { upAt: up } = await server.restart()
          await until(() => answers(sql`select 1`, Math.max(0, up + 2000 - Date.now())), 2000).catch(() => {
            throw new Error(`restart ${restart}: no answer within 2 s of the server accepting connections`)
          })
        }
        expect(answered).toBeGreaterThan(0)
      } finally {
        loading = false
        await Promise.all(workers)
      }
    },
    30_000,
  )
})

/** How a query settles within `ms`: its first row's `n`, its error's code, or 'pending'. */
function outcome(query: PromiseLike<readonly object[]>, ms: number): Promise<number | string> {
  return Promise.race([
    Promise.resolve(query).then(
      rows => (rows[0] as { n: number }).n,
      (error: { code?: string }) => error.code ?? String(error),
    ),
    Bun.sleep(ms).then(() => 'pending'),
  ])
}

/** adminUrl through `proxy` (its user and database kept). */
function through(proxy: { url: string }): string {
  const url = new URL(adminUrl)
  url.host = new URL(proxy.url).host
  return url.toString()
}

describe('the PostgreSQL driver when its server falls silent (a half-open connection)', () => {
  test('a query that hears nothing for silence_timeout fails CONNECTION_SILENT, and the pool connects afresh', async () => {
    // The proxy holds what the client sends: the server never sees the query, and never answers.
    const proxy = await startHeldProxy(adminUrl)
    // Two connections, as a pool has room to spare: a query sent before the silent one's socket has
    // closed would otherwise be pipelined on it, and fail with it.
    const sql = postgres(through(proxy), { max: 2, silence_timeout: 0.5, connect_timeout: 5, onnotice: () => {} })
    try {
      expect(await outcome(sql`select 1 as n`, 5000)).toBe(1)
      proxy.hold()
      const silent = await Promise.race([sql`select 2 as n`.catch((error: unknown) => error), Bun.sleep(5000).then(() => 'pending')])
      expect((silent as { code?: string }).code).toBe('CONNECTION_SILENT')
      expect(isConnectionError(silent)).toBe(true)
      proxy.release()
      expect(await outcome(sql`select 3 as n`, 5000)).toBe(3)
    } finally {
      await sql.end({ timeout: 0 })
      await proxy.close()
    }
  }, 20_000)

  test('the limit counts only while an answer is owed: an idle connection and a transaction that waits on its client live on', async () => {
    const sql = postgres(adminUrl, { max: 1, silence_timeout: 0.5, onnotice: () => {} })
    try {
      const [before] = await sql<{ pid: number }[]>`select pg_backend_pid() as pid`
      await Bun.sleep(1200)
      const inTransaction = await sql.begin(async tx => {
        const [first] = await tx<{ pid: number }[]>`select pg_backend_pid() as pid`
        await Bun.sleep(1200)
        // A statement that answers within the limit is no silence.
        await tx`select pg_sleep(0.2)`
        return first!.pid
      })
      const [after] = await sql<{ pid: number }[]>`select pg_backend_pid() as pid`
      expect([inTransaction, after!.pid]).toEqual([before!.pid, before!.pid])
    } finally {
      await sql.end({ timeout: 0 })
    }
  }, 20_000)

  test('the service’s pools with a statement timeout give up silence just past it; the invoice run’s, with none, waits', async () => {
    const proxy = await startHeldProxy(adminUrl)
    const timed = createSql(through(proxy), { max: 1, statementTimeoutMs: 300 })
    const untimed = createSql(through(proxy), { max: 1 })
    pools.push(timed, untimed)
    try {
      expect(
        await outcome(
          Promise.all([timed`select 1 as n`, untimed`select 1 as n`]).then(([rows]) => rows),
          5000,
        ),
      ).toBe(1)
      proxy.hold()
      const given = timed`select 2 as n`
      // Not before the statement timeout and its grace have passed.
      expect(await outcome(given, 300 + silenceGraceMs - 1000)).toBe('pending')
      const waited = Promise.all([outcome(given, 3000), outcome(untimed`select 2 as n`, 3000)])
      const rest = untimed`select 3 as n`
      expect(await waited).toEqual(['CONNECTION_SILENT', 'pending'])
      proxy.release()
      expect(await outcome(rest, 5000)).toBe(3)
    } finally {
      await proxy.close()
    }
  }, 30_000)

  test('the longest statement timeout Postgres takes still leaves the silence limit a timer can hold', async () => {
    // 2^31 - 1 ms, plus the grace, is past what a timer holds: a timer given more fires at once.
    const sql = createSql(adminUrl, { max: 1, statementTimeoutMs: 2 ** 31 - 1 })
    pools.push(sql)
    expect(await outcome(sql`select pg_sleep(0.1), 1 as n`, 5000)).toBe(1)
  })
})

describe('the PostgreSQL driver on a server that refuses writes', () => {
  /**
   * A table, and a pool of one connection opened read-only, as one that a failover's DNS name led to
   * a fenced old primary or a hot standby. Opened so, it is kept for its reads (not left, nor opened
   * again and again): only a refused write, or the server turning read-only after it opened, leaves it.
   */
  const readOnlyPool = async (name: string) => {
    const admin = createSql(adminUrl, { max: 1, applicationName: `am-test-${name}-admin` })
    pools.push(admin)
    const table = `${name.replaceAll('-', '_')}_${randomBytes(4).toString('hex')}`
    await admin`create table ${admin(table)} (x int)`
    const sql = createSql(adminUrl, { max: 1, applicationName: `am-test-${name}`, settings: { default_transaction_read_only: 'on' } })
    pools.push(sql)
    const pid = async () =>
      (await sql<{ pid: number; ro: string }[]>`select pg_backend_pid() as pid, current_setting('default_transaction_read_only') as ro`)[0]!
    const before = await pid()
    expect(before.ro).toBe('on')
    for (let i = 0; i < 3; i++) expect((await pid()).pid).toBe(before.pid)
    return { sql, admin, table, pid, before }
  }

  test('a connection refused a write as read-only (25006) is left: the next statement opens another', async () => {
    const { sql, admin, table, pid, before } = await readOnlyPool('read-only')
    const refused = (await sql`insert into ${sql(table)} values (1)`.catch((error: unknown) => error)) as { code?: string }
    expect(refused.code).toBe('25006')
    expect(isConnectionError(refused)).toBe(true)
    const after = await pid()
    expect(after.pid).not.toBe(before.pid)
    await admin`drop table ${admin(table)}`
  })

  test('in a transaction, the connection is left once the transaction has rolled back', async () => {
    const { sql, admin, table, pid, before } = await readOnlyPool('read-only-tx')
    const refused = (await sql
      .begin(async tx => {
        await tx`select 1`
        await tx`insert into ${sql(table)} values (1)`
      })
      .catch((error: unknown) => error)) as { code?: string }
    expect(refused.code).toBe('25006')
    const after = await pid()
    expect(after.pid).not.toBe(before.pid)
    await admin`drop table ${admin(table)}`
  })

  test('a reserved connection refused a write is left once released, and the pool then ends (the migrator’s)', async () => {
    const { sql, admin, table, before } = await readOnlyPool('read-only-reserved')
    const session = await sql.reserve()
    const refused = (await session`insert into ${sql(table)} values (1)`.catch((error: unknown) => error)) as { code?: string }
    expect(refused.code).toBe('25006')
    // Still the session's until released: the same backend.
    expect((await session<{ pid: number }[]>`select pg_backend_pid() as pid`)[0]!.pid).toBe(before.pid)
    session.release()
    // The migrator's pool is ended at once (a boot on a read-only server used to hang here for ever).
    const ended = await Promise.race([sql.end().then(() => 'ended'), Bun.sleep(5000).then(() => 'still waiting')])
    expect(ended).toBe('ended')
    await admin`drop table ${admin(table)}`
  })

  test.skipIf(!reportsHotStandby)('a server a pooler reports turning into a hot standby (in_hot_standby on) is left once idle', async () => {
    // PostgreSQL itself reports in_hot_standby only going off (a promotion: demotion restarts it); a
    // pooler that moves a client's session to a standby is what turns it on under the client.
    const proxy = await startHeldProxy(adminUrl)
    const sql = createSql(through(proxy), { max: 2, applicationName: 'am-test-hot-standby' })
    pools.push(sql)
    try {
      const read = async () => (await sql<{ pid: number }[]>`select pg_backend_pid() as pid, pg_sleep(0.05)`)[0]!.pid
      const before = new Set(await Promise.all([read(), read()]))
      expect(before.size).toBe(2)
      proxy.inject(parameterStatus('in_hot_standby', 'on'))
      // Each connection answers the statement its server's report came with, then is left.
      expect(before).toEqual(new Set(await Promise.all([read(), read()])))
      const after = await Promise.all([read(), read()])
      expect(after.filter(pid => before.has(pid))).toEqual([])
    } finally {
      await proxy.close()
    }
  })
})

/** A ParameterStatus message of the protocol (`S`), as a server reports a setting it changed. */
function parameterStatus(name: string, value: string): Buffer {
  const body = Buffer.from(`${name}\0${value}\0`)
  const message = Buffer.alloc(5 + body.length)
  message.write('S')
  message.writeInt32BE(4 + body.length, 1)
  body.copy(message, 5)
  return message
}

interface Answer {
  pid: number
  ro: string
}

describe.skipIf(!hasServerBinaries)('the PostgreSQL driver when its server turns read-only under it (a failover fencing the old primary)', () => {
  let server: PostgresServer
  let admin: Sql

  beforeAll(async () => {
    server = await startPostgresServer()
    servers.push(server)
    admin = createSql(server.url(), { max: 1, applicationName: 'am-test-fence' })
    pools.push(admin)
    await admin`create table flight (x int)`
  }, 30_000)

  /**
   * What a failover tool does to fence the old primary: ALTER SYSTEM and a reload. A backend takes the
   * new setting when it next reads a statement, and reports it (ParameterStatus) with that answer.
   * Resolves once a session sees it: the postmaster has signalled every backend by then.
   */
  async function fence(on: boolean) {
    await admin.unsafe(`alter system set default_transaction_read_only = ${on ? 'on' : 'off'}`)
    await admin`select pg_reload_conf()`
    const want = on ? 'on' : 'off'
    await until(async () => (await admin<Answer[]>`select current_setting('default_transaction_read_only') as ro`)[0]!.ro === want, 5000)
  }

  const asked = (sql: Sql) => async () =>
    (await sql<Answer[]>`select pg_backend_pid() as pid, current_setting('default_transaction_read_only') as ro, pg_sleep(0.02)`)[0]!

  test('a pool’s connections that only read are left once idle, and replaced by ones that stay', async () => {
    const sql = createSql(server.url(), { max: 4, applicationName: 'am-test-fenced-reads' })
    pools.push(sql)
    const read = asked(sql)
    const round = () => Promise.all(Array.from({ length: 4 }, read))
    const before = new Set((await round()).map(answer => answer.pid))
    expect(before.size).toBe(4)
    try {
      await fence(true)
      // Every statement answers (Promise.all would throw). Each old connection answers at most the
      // round in which its server reported the change (and what was pipelined behind it), no later one.
      const rounds: Answer[][] = []
      while (rounds.length === 0 || rounds.at(-1)!.some(answer => before.has(answer.pid))) {
        if (rounds.length === 10) throw new Error(`old connections still answer after 10 rounds: ${JSON.stringify(rounds)}`)
        rounds.push(await round())
      }
      const toldIn = new Map<number, number>()
      rounds.forEach((answers, index) => {
        for (const { pid, ro } of answers) {
          if (!before.has(pid)) continue
          expect(toldIn.has(pid) && toldIn.get(pid)! < index).toBe(false)
          if (ro === 'on' && !toldIn.has(pid)) toldIn.set(pid, index)
        }
      })
      expect([...toldIn.keys()].sort()).toEqual([...before].sort())
      // Their backends are gone from the server: ended, not merely set aside.
      await until(async () => (await admin`select 1 from pg_stat_activity where pid in ${admin([...before])}`).length === 0, 5000)
      // The new connections opened read-only stay: no connection is opened, left and opened again.
      const later = (await Promise.all(Array.from({ length: 5 }, round))).flat()
      expect(later.every(answer => answer.ro === 'on' && !before.has(answer.pid))).toBe(true)
      const replacements = new Set([...rounds.at(-1)!, ...later].map(answer => answer.pid))
      expect(replacements.size).toBeLessThanOrEqual(4)
    } finally {
      await fence(false)
    }
  })

  test('after a failover that fences the old primary, a pool that only reads moves to where the name now leads', async () => {
    const primary = await startPostgresServer()
    servers.push(primary)
    // The service's DATABASE_URL: a name (here a proxy) that the failover points at the new primary.
    const name = await startHeldProxy(server.url())
    const sql = createSql(through(name), { max: 4, applicationName: 'am-test-failover' })
    pools.push(sql)
    const where = async () => (await sql<{ port: string }[]>`select current_setting('port') as port, pg_sleep(0.02)`)[0]!.port
    const round = () => Promise.all(Array.from({ length: 4 }, where))
    try {
      expect(await round()).toEqual(Array(4).fill(String(server.port)))
      name.retarget(primary.url())
      await fence(true)
      // Each old connection reads the old primary once more (the statement its server's report comes
      // with; twice if the reload reached its backend only after that statement): then the new one.
      const stale: string[] = []
      for (let rounds = 0; rounds < 3; rounds++) stale.push(...(await round()).filter(port => port === String(server.port)))
      expect(stale.length).toBeLessThanOrEqual(8)
      for (let rounds = 0; rounds < 3; rounds++) expect(await round()).toEqual(Array(4).fill(String(primary.port)))
    } finally {
      await name.close()
      await fence(false)
    }
  }, 30_000)

  test('statements pipelined and a transaction in flight as the server turns read-only complete; then the connection is left', async () => {
    const sql = createSql(server.url(), { max: 1, applicationName: 'am-test-fenced-flight' })
    pools.push(sql)
    const read = asked(sql)
    const before = (await read()).pid
    try {
      let begun!: () => void
      let proceed!: () => void
      const inside = new Promise<void>(resolve => (begun = resolve))
      const gate = new Promise<void>(resolve => (proceed = resolve))
      // Begun read-write before the fence, the transaction stays so to its COMMIT.
      const transaction = sql.begin(async tx => {
        await tx`insert into flight values (1)`
        begun()
        await gate
        const [answer] = await tx<Answer[]>`select pg_backend_pid() as pid, current_setting('default_transaction_read_only') as ro`
        await tx`insert into flight values (2)`
        return answer!
      })
      await inside
      await fence(true)
      // Queued behind the transaction on the pool's one connection.
      const waiting = Array.from({ length: 3 }, read)
      proceed()
      const told = await transaction
      expect(told).toEqual({ pid: before, ro: 'on' })
      expect((await admin<{ n: number }[]>`select count(*)::int as n from flight`)[0]!.n).toBe(2)
      const next = await Promise.all(waiting)
      expect(next.every(answer => answer.pid !== before)).toBe(true)

      // Pipelined: all sent on one connection before its first answer reports the change.
      await fence(false)
      const second = (await read()).pid
      await read()
      await fence(true)
      const pipelined = await Promise.all(Array.from({ length: 6 }, read))
      expect(pipelined.map(answer => answer.pid)).toEqual(Array(6).fill(second))
      expect((await read()).pid).not.toBe(second)
    } finally {
      await fence(false)
    }
  })
})

/** Whether this machine has an IPv6 loopback address to listen on. */
function hasIpv6Loopback(): boolean {
  try {
    Bun.listen({ hostname: '::1', port: 0, socket: { data() {} } }).stop(true)
    return true
  } catch {
    return false
  }
}

const ipv6 = hasIpv6Loopback()
if (!ipv6) console.warn('postgres-driver: skipping the connections over IPv6, this machine has no ::1')

describe('the PostgreSQL driver given an IPv6 literal host in its URL', () => {
  const parsed = (url: string) => {
    const { host, port } = postgres(url).options
    return { host, port }
  }

  test('the address in brackets is the host, and a port follows the bracket; IPv4 and names as before', () => {
    // Upstream split every host at its first colon: [::1] connected to a host named "[" (ENOTFOUND).
    expect(parsed('postgres://u:p@[::1]:5433/db')).toEqual({ host: ['::1'], port: [5433] })
    expect(parsed('postgres://u@[2001:db8::1]/db')).toEqual({ host: ['2001:db8::1'], port: [5432] })
    expect(parsed('postgres://u@[::1]:5433,127.0.0.1:5434/db')).toEqual({ host: ['::1', '127.0.0.1'], port: [5433, 5434] })
    expect(parsed('postgres://u@[::1],[2001:db8::1]:5434,db.example.com/db')).toEqual({
      host: ['::1', '2001:db8::1', 'db.example.com'],
      port: [5432, 5434, 5432],
    })
    expect(parsed('postgres://u@127.0.0.1:5433/db')).toEqual({ host: ['127.0.0.1'], port: [5433] })
    expect(parsed('postgres://u@db.example.com/db')).toEqual({ host: ['db.example.com'], port: [5432] })
    // A host without a port takes the first host's (upstream's rule, kept).
    expect(parsed('postgres://u@127.0.0.1:5433,db.example.com/db')).toEqual({ host: ['127.0.0.1', 'db.example.com'], port: [5433, 5433] })
  })

  describe.skipIf(!ipv6 || !hasServerBinaries)('against a server listening on ::1', () => {
    let server: PostgresServer
    const where = async (sql: Sql) => (await sql<{ addr: string }[]>`select host(inet_server_addr()) as addr`)[0]!.addr

    beforeAll(async () => {
      server = await startPostgresServer({ ipv6: true })
      servers.push(server)
    }, 30_000)

    test('a URL naming [::1] with its port, or without one (the pool’s default), connects over IPv6', async () => {
      const sql = createSql(`postgres://postgres@[::1]:${server.port}/postgres`, { max: 1 })
      pools.push(sql)
      expect(await where(sql)).toBe('::1')
      const defaulted = postgres('postgres://postgres@[::1]/postgres', { port: server.port, max: 1, onnotice: () => {} }) as unknown as Sql
      pools.push(defaulted)
      expect(await where(defaulted)).toBe('::1')
    })

    test('a host list mixing IPv6 and IPv4 reaches each in turn', async () => {
      const refused = await freePort()
      const toIpv6 = createSql(`postgres://postgres@127.0.0.1:${refused},[::1]:${server.port}/postgres`, { max: 1 })
      const toIpv4 = createSql(`postgres://postgres@[::1]:${refused},127.0.0.1:${server.port}/postgres`, { max: 1 })
      pools.push(toIpv6, toIpv4)
      expect(await where(toIpv6)).toBe('::1')
      expect(await where(toIpv4)).toBe('127.0.0.1')
    })
  })
})
