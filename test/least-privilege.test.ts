/**
 * A database role the operator limited (docs/operations.md, "A role that owns nothing"): the
 * migrations applied by a role that owns the tables, the service run as one allowed only to read and
 * write them, with the grants that section lists; and the one line the boot stops with where the
 * role may not do what the service does. Roles are the cluster's: named after this file's database,
 * dropped after it.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createSql, type Sql } from '../src/db.ts'
import { reachDatabase } from '../src/reach-database.ts'
import { migrate, readMigrations, serviceObjects, type Migration } from '../src/migrate.ts'
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

/** What a boot does before it serves: reach the database (refusing what it cannot run in), then migrate. */
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

test('a table, sequence or function the role may not use stops the boot naming the grant; the documented grants let it boot', async () => {
  // A table made without the default privileges (upstream: a boot, then 500s on what needs it).
  const revoke = `revoke all on blog_posts from ${app}; revoke usage on sequence outbox_id_seq from ${app}`
  await admin.unsafe(revoke)
  await admin.unsafe(`revoke execute on function uuid_v7() from public`)
  try {
    const refused = await boot(app).then(
      () => 'booted',
      (error: Error) => error.message,
    )
    expect(refused).toContain(
      `DATABASE_URL's role ${app} may not use all of the service's objects in schema public (lacking select, insert, update, ` +
        'delete on table public.blog_posts; usage on sequence public.outbox_id_seq; execute on function public.uuid_v7()): ' +
        `grant select, insert, update, delete on table public.blog_posts to ${app}; grant usage on sequence public.outbox_id_seq to ${app}; ` +
        `grant execute on function public.uuid_v7() to ${app}`,
    )
    // Run as written by an operator's session, whose search_path is not the service's (upstream: "relation blog_posts does not exist").
    await admin.begin(async tx => {
      await tx`set local search_path = pg_catalog`
      await tx.unsafe(refused.slice(refused.lastIndexOf('): ') + 3))
    })
    expect(await boot(app)).toEqual([])
  } finally {
    await admin.unsafe(`grant execute on function uuid_v7() to public`)
  }
  await admin.unsafe(revoke)
  await admin.unsafe(documentedGrants()[1]!)
  expect(await boot(app)).toEqual([])
})

test('what PostgreSQL does not check is not asked for: a trigger’s function, an identity column’s sequence, usage where update is granted', async () => {
  // A DBA's hardening: execute revoked from PUBLIC, given back on what defaults and checks call (a
  // trigger's function is checked when the trigger is made, not when it fires).
  await admin.unsafe(`revoke execute on all functions in schema public from public`)
  await admin.unsafe(`grant execute on function uuid_v7(), blog_tags_valid(text[]) to ${app}`)
  // nextval takes usage or update.
  await admin.unsafe(`revoke usage on sequence messages_seq_seq from ${app}; grant update on sequence messages_seq_seq to ${app}`)
  // A key made an identity column (as a later migration may make one): inserts need nothing on its sequence.
  await admin.unsafe(`
    alter table outbox alter column id drop default;
    drop sequence outbox_id_seq;
    alter table outbox alter column id add generated by default as identity;
    revoke all on sequence outbox_id_seq from ${app}
  `)
  try {
    // Upstream: refused, lacking execute on context_entries_append_only(), usage on both sequences.
    expect(await boot(app)).toEqual([])
    const sql = createSql(as(app), { max: 1 })
    try {
      const [row] = await sql<{ id: number }[]>`insert into outbox (type, data) values ('probe', '{}') returning id`
      await sql`delete from outbox where id = ${row!.id}`
      await sql`select nextval('messages_seq_seq')`
    } finally {
      await sql.end()
    }
  } finally {
    await admin.unsafe(`grant execute on all functions in schema public to public; grant usage on sequence messages_seq_seq, outbox_id_seq to ${app}`)
  }
})

test('row-level security, read-only sessions or a schema the role may not use stop the boot with one line naming it', async () => {
  // Upstream: the owner's agents went missing from their list and writes answered 500.
  await admin`alter table participants enable row level security`
  try {
    const refused = `row-level security applies to DATABASE_URL's role ${app} on table public.participants; the service reads and writes every row `
    await expect(boot(app)).rejects.toThrow(
      refused +
        `of its tables: alter table public.participants disable row level security, alter role ${app} bypassrls, or give it a policy ` +
        `that lets every row through and no restrictive one: create policy marketplace on public.participants for all to ${app} using (true)`,
    )
    // As on Supabase, where every table of an exposed schema has it: a policy that lets the role see and write every row (upstream: refused).
    await admin.unsafe(`create policy marketplace on participants for all to ${app} using (true)`)
    expect(await boot(app)).toEqual([])
    await admin.unsafe(`create policy narrow on participants as restrictive for all to public using (false)`)
    await expect(boot(app)).rejects.toThrow(refused)
  } finally {
    await admin`alter table participants disable row level security`
    await admin`drop policy if exists marketplace on participants`
    await admin`drop policy if exists narrow on participants`
  }
  // A replica's user given by mistake: upstream, a boot with nothing pending served, every write a 503.
  await admin.unsafe(`alter role ${app} in database ${name} set default_transaction_read_only = on`)
  try {
    await expect(boot(app)).rejects.toThrow(
      `the database's sessions are read-only, default_transaction_read_only = 'on' (set by alter role ${app} in database ${name}), ` +
        `and the service writes: alter role ${app} in database ${name} reset default_transaction_read_only`,
    )
  } finally {
    await admin.unsafe(`alter role ${app} in database ${name} reset default_transaction_read_only`)
  }
  // Upstream: "names no schema that exists", and a search_path to set as it already was.
  await admin`revoke usage on schema public from public`
  try {
    await expect(boot(app)).rejects.toThrow(
      `DATABASE_URL's role ${app} may not use schema public, which holds the service's tables: grant usage on schema public to ${app}`,
    )
  } finally {
    await admin`grant usage on schema public to public`
  }
  expect(await boot(app)).toEqual([])
})

test('the service’s objects read from the migrations are the tables and functions a migrated database holds', async () => {
  const tables = await admin<{ name: string }[]>`select relname as name from pg_class where relnamespace = 'public'::regnamespace and relkind = 'r'`
  const functions = await admin<{ name: string }[]>`select proname as name from pg_proc where pronamespace = 'public'::regnamespace`
  const objects = serviceObjects()
  expect(objects.tables.toSorted()).toEqual(tables.map(row => row.name).toSorted())
  expect(objects.functions.toSorted()).toEqual(functions.map(row => row.name).toSorted())
})
