/**
 * A database role the operator limited (docs/operations.md, "A role that owns nothing"): the
 * migrations applied by a role that owns the tables, the service run as one allowed only to read and
 * write them, with the grants that section lists; and the one line the boot stops with where the
 * role may not apply the migrations. Roles are the cluster's: named after this file's database,
 * dropped after it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createSql, reachDatabase, type Sql } from '../src/db.ts'
import { migrate, readMigrations, type Migration } from '../src/migrate.ts'
import { adminUrl, databaseUrl } from './helpers/database.ts'
import { createTestContext, signUp, subscribedPair } from './helpers/context.ts'

const name = `leastpriv_${Math.floor(Date.now() / 1000)}_${randomBytes(4).toString('hex')}`
const owner = `${name}_owner`
const app = `${name}_app`
let admin: Sql

/** The database's URL as `role`. */
function as(role: string): string {
  const url = new URL(databaseUrl(name))
  url.username = role
  return url.toString()
}

/** What a boot does before it serves: reach the database, then migrate. */
async function boot(role: string, migrations: Migration[] = readMigrations()): Promise<string[]> {
  await reachDatabase(as(role))
  const sql = createSql(as(role), { max: 1 })
  try {
    return await migrate(sql, migrations)
  } finally {
    await sql.end()
  }
}

/** The SQL blocks of docs/operations.md's section on it, for this file's roles: the documentation is what is tested. */
function documentedGrants(): string[] {
  const text = readFileSync(join(import.meta.dir, '..', 'docs', 'operations.md'), 'utf8')
  const section = text.slice(text.indexOf('## A role that owns nothing'), text.indexOf('## Managed PostgreSQL'))
  const blocks = [...section.matchAll(/```sql\n([\s\S]*?)```/g)].map(match => match[1]!)
  expect(blocks).toHaveLength(2)
  return blocks.map(block => block.replaceAll('marketplace_owner', owner).replaceAll('marketplace_app', app))
}

beforeAll(async () => {
  const server = createSql(adminUrl, { max: 1 })
  await server`create database ${server(name)}`
  await server.end()
  admin = createSql(databaseUrl(name), { max: 1 })
  // PostgreSQL 15's default, on any version (14 and older let every role create in public).
  await admin`revoke create on schema public from public`
  // The roles and the grants an operator runs first, as a superuser.
  await admin.unsafe(documentedGrants()[0]!)
})

afterAll(async () => {
  await admin.end()
  const server = createSql(adminUrl, { max: 1 })
  await server`drop database if exists ${server(name)} with (force)`
  for (const role of [owner, app]) await server`drop role if exists ${server(role)}`
  await server.end()
})

test('a new database: the service’s role may not create its tables in public, and the boot says what to run', async () => {
  // Upstream: `permission denied for schema public`, naming neither the role nor a way out.
  const refused = boot(app)
  await expect(refused).rejects.toThrow(
    `migration 00001_identity.sql failed: permission denied for schema public: role ${app} may not create the service's tables in schema public`,
  )
  await expect(refused).rejects.toThrow(`grant create on schema public to ${app}, or run npm run migrate with a DATABASE_URL whose role may`)
})

test('migrated by the owner, the service boots as a role that may only read and write, and serves', async () => {
  expect(await boot(owner)).toEqual(readMigrations().map(migration => migration.name))
  // With nothing pending it creates nothing: upstream, `create table if not exists migrations` stopped it.
  expect(await boot(app)).toEqual([])

  const ctx = await createTestContext({ database: { name, url: as(app), drop: async () => {} }, actors: true })
  try {
    const alice = await signUp(ctx)
    const pair = await subscribedPair(ctx, alice)
    const sent = await ctx.call('POST', `/v1/conversations/${pair.agent.id}/messages`, { token: pair.user.token, body: { text: 'Hello' } })
    expect(sent.status).toBe(201)
    const polled = await ctx.call('GET', '/v1/agent/events', { apiKey: pair.agent.apiKey })
    expect(polled.body.data.pendingConversations.map((c: { latestMessage: string }) => c.latestMessage)).toEqual(['Hello'])
    const replied = await ctx.call('POST', '/v1/agent/conversation-reply', { apiKey: pair.agent.apiKey, body: { userId: pair.user.id, text: 'Hi' } })
    expect(replied.status).toBe(201)
    const listing = await ctx.call('POST', '/v1/billing/configs', {
      token: alice.token,
      body: { participantId: pair.agent.id, name: 'Rules', priceCents: 300, fileType: '.cursorrules', content: 'Be brief.' },
    })
    expect((await ctx.call('POST', `/v1/billing/configs/${listing.body.data.id}/purchase`, { token: pair.user.token })).status).toBe(201)
    // Its invoice's id is uuid_v7()'s, a function of the migrations'.
    const invoices = await ctx.call('GET', '/v1/billing/invoices', { token: pair.user.token })
    expect(invoices.body.data).toHaveLength(1)
  } finally {
    await ctx.close()
  }
})

test('a migration pending that the role may not apply (an upgrade whose migrate was forgotten) stops the boot with one line', async () => {
  const migrations = readMigrations()
  const next = {
    id: migrations.length + 1,
    name: `${String(migrations.length + 1).padStart(5, '0')}_probe.sql`,
    text: 'create table probe (id int);',
  }
  await expect(boot(app, [...migrations, next])).rejects.toThrow(
    `migration ${next.name} failed: permission denied for schema public: role ${app} may not change the service's tables: ` +
      'run npm run migrate with a DATABASE_URL whose role owns them, then start the service',
  )
})
