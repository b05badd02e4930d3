/**
 * A database whose defaults someone else chose (a DBA's postgresql.conf, a managed service's, `alter
 * role ... set`): the service's sessions set what its SQL and its driver assume (src/db.ts,
 * `sessionDefaults`), and bytea is read in either output form, so it serves as on a stock server.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createSql } from '../src/db.ts'
import { reachDatabase, versionRefusal } from '../src/reach-database.ts'
import { createAgent, createTestContext, expectError, signUp, type TestContext, type TestUser } from './helpers/context.ts'
import { adminUrl, createTestDatabase, type TestDatabase } from './helpers/database.ts'

let database: TestDatabase
let ctx: TestContext
let owner: TestUser

beforeAll(async () => {
  database = await createTestDatabase()
  const admin = createSql(adminUrl, { max: 1 })
  try {
    for (const setting of [
      `default_transaction_isolation = 'serializable'`,
      `DateStyle = 'SQL, DMY'`,
      `bytea_output = 'escape'`,
      `TimeZone = 'Pacific/Chatham'`,
    ]) {
      await admin.unsafe(`alter database ${database.name} set ${setting}`)
    }
  } finally {
    await admin.end()
  }
  ctx = await createTestContext({ database })
  owner = await signUp(ctx, 'owner')
})
afterAll(async () => {
  await ctx.close()
  await database.drop()
})

async function plan(): Promise<string> {
  const agent = await createAgent(ctx, owner)
  const made = await ctx.call('POST', '/v1/billing/plans', {
    token: owner.token,
    body: { participantId: agent.id, name: 'Basic', monthlyPriceCents: 1000, includedProxyCalls: 100, overagePerCallCents: 5 },
  })
  expect(made.status).toBe(201)
  return made.body.data.id
}

test('times are read as stored (DateStyle): a user’s createdAt is the ISO instant of its row', async () => {
  const me = await ctx.call('GET', '/v1/auth/me', { token: owner.token })
  expect(me.status).toBe(200)
  const [row] = await ctx.deps.sql<
    { at: string }[]
  >`select to_char(created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as at from users where id = ${me.body.data.id}`
  expect(me.body.data.createdAt).toBe(row!.at)
})

test('racing writes meet as under read committed: 50 concurrent subscriptions are one 201 and 409s, no 503', async () => {
  const planId = await plan()
  const user = await signUp(ctx)
  const results = await Promise.all(
    Array.from({ length: 50 }, () => ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId } })),
  )
  expect(results.filter(r => r.status === 201)).toHaveLength(1)
  for (const r of results.filter(r => r.status !== 201)) expectError(r, 409, 'already_subscribed')
})

test('an Idempotency-Key’s stored answer is read back as stored (bytea_output): the repeat is the same answer', async () => {
  const planId = await plan()
  const user = await signUp(ctx)
  const headers = { 'idempotency-key': 'defaults-key' }
  const first = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
  const again = await ctx.call('POST', '/v1/billing/subscriptions', { token: user.token, body: { planId }, headers })
  expect(first.status).toBe(201)
  expect(again.status).toBe(201)
  expect(again.body).toEqual(first.body)
})

test('a fresh database shared with another application (its own migrations and conversations in a schema of its own) is no reason to refuse the boot', async () => {
  const shared = await createTestDatabase({ empty: true })
  const admin = createSql(shared.url, { max: 1 })
  try {
    // A Laravel chat app's tables: the same names, not the service's.
    await admin.unsafe(`create schema chatapp`)
    await admin.unsafe(`create table chatapp.migrations (id serial primary key, migration text not null, batch integer not null)`)
    await admin.unsafe(`create table chatapp.conversations (id serial primary key)`)
    await reachDatabase(shared.url)
    // The service's own, there: the migrations would make them anew, empty, in public.
    await admin.unsafe(`create schema svc`)
    await admin.unsafe(`create table svc.migrations (id integer primary key, name text not null, applied_at timestamptz not null default now())`)
    await admin.unsafe(`create table svc.conversations (participant_id uuid, user_id uuid, primary key (participant_id, user_id))`)
    await expect(reachDatabase(shared.url)).rejects.toThrow(`leads to schema public, but the service's tables are in svc`)
  } finally {
    await admin.end()
    await shared.drop()
  }
})

test('a session in a zone that is UTC by another name (Etc/UTC, as initdb writes it in many containers) is no reason to refuse the boot; London is', async () => {
  for (const zone of ['Etc/UTC', 'GMT', 'Zulu']) await reachDatabase(database.url, { settings: { TimeZone: zone } })
  // On UTC's time in winter, an hour ahead from March to October: its months end an hour early then.
  await expect(reachDatabase(database.url, { settings: { TimeZone: 'Europe/London' } })).rejects.toThrow(
    `TimeZone = 'Europe/London' is set in DATABASE_URL, not the 'UTC' the service needs`,
  )
})

test('a database in an encoding other than UTF8 is refused at boot in one line naming DATABASE_URL; so is a client_encoding other than UTF8 there', async () => {
  // LATIN1 refused emoji and CJK as values that cannot be stored; SQL_ASCII counted lengths in bytes (500 emoji: a 500).
  for (const encoding of ['SQL_ASCII', 'LATIN1']) {
    const other = await createTestDatabase({ encoding })
    try {
      const refused = await reachDatabase(other.url).catch((error: Error) => error.message)
      expect(refused).toStartWith(`PostgreSQL at DATABASE_URL=${other.url.replace('postgres@', '***@')} cannot serve: `)
      expect(refused).toContain(`the database ${other.name} has encoding ${encoding}, not UTF8`)
      expect(refused).toContain('createdb -E UTF8')
      expect(refused).not.toContain('\n')
    } finally {
      await other.drop()
    }
  }
  // The URL's parameter outranks what the driver sends: text was stored garbled (é as Ã©), without an error.
  await expect(reachDatabase(`${database.url}?client_encoding=LATIN1`)).rejects.toThrow(
    `client_encoding = 'LATIN1' is set in DATABASE_URL, not the 'UTF8' the service needs: remove it from there`,
  )
})

test('a server older than PostgreSQL 13 is refused by the version it names; 13 and later are not', () => {
  // On 12.22 the boot went on to fail its first migration (`function gen_random_uuid() does not exist`).
  // The server this suite runs on says it is new enough, which every boot here checks.
  for (const [number, version] of [
    [120022, '12.22'],
    [90624, '9.6.24'],
    [129999, '12.99 (Debian 12.99-1.pgdg120+1)'],
  ] as const) {
    const refused = versionRefusal(number, version)
    expect(refused).toStartWith(`it is PostgreSQL ${version}, and the service needs 13 or later`)
    expect(refused).toContain('pg_upgrade')
  }
  for (const number of [130000, 130023, 150010, 180004]) expect(versionRefusal(number, 'any')).toBeNull()
})

test('a read-only session or a search_path set in DATABASE_URL is named as set there, with the fix that outranks it', async () => {
  // Upstream: "(the server's client)", and an alter role that the URL's value outranks, or a primary to find.
  await expect(reachDatabase(`${database.url}?default_transaction_read_only=on`)).rejects.toThrow(
    `default_transaction_read_only = 'on' (set in DATABASE_URL), and the service writes: remove default_transaction_read_only from DATABASE_URL`,
  )
  await expect(reachDatabase(`${database.url}?search_path=nowhere`)).rejects.toThrow(
    `search_path = 'nowhere' (set in DATABASE_URL) names no schema that exists, where the migrations create the service's tables: ` +
      'set search_path = public in DATABASE_URL',
  )
})

test('the database’s own client_encoding is outranked by the driver’s: text is stored as sent', async () => {
  const admin = createSql(adminUrl, { max: 1 })
  try {
    await admin.unsafe(`alter database ${database.name} set client_encoding = 'LATIN1'`)
  } finally {
    await admin.end()
  }
  await reachDatabase(database.url)
  const sql = createSql(database.url, { max: 1 })
  try {
    const [row] = await sql<{ stored: boolean; back: string }[]>`select ${'é😀'}::text = chr(233) || chr(128512) as stored, ${'é😀'}::text as back`
    expect(row).toEqual({ stored: true, back: 'é😀' })
  } finally {
    await sql.end()
  }
})
