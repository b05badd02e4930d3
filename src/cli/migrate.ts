/** `bun run migrate`: applies pending migrations to DATABASE_URL and prints what it applied. */
import { loadConfig } from '../config.ts'
import { createSql } from '../db.ts'
import { reachDatabase } from '../reach-database.ts'
import { migrate, type LockHolder } from '../migrate.ts'
import { runCli } from './run.ts'

await runCli('migrate', 'usage: npm run migrate (applies the migrations in sql/ to DATABASE_URL)', {}, async () => {
  const config = loadConfig(process.env)
  if (!config.databaseUrl) throw new Error('set DATABASE_URL (the embedded database is migrated by `npm start` itself)')
  await reachDatabase(config.databaseUrl)
  const sql = createSql(config.databaseUrl, { max: 1 })
  try {
    let newer: string[] = []
    const applied = await migrate(sql, undefined, config.migrationTimeouts, {
      waiting: holder =>
        console.error(`migrate: waiting ${Math.round(holder.waitedMs / 1000)} s for the migration lock, held by ${describe(holder)}`),
      ahead: names => (newer = names),
    })
    if (newer.length > 0) console.log(`migrate: up to date; the database also has ${newer.join(', ')}, from newer code`)
    else console.log(applied.length === 0 ? 'migrate: up to date' : `migrate: applied ${applied.join(', ')}`)
  } finally {
    await sql.end()
  }
})

// A declaration, not a const: the top-level await above calls it while a run waits for the lock,
// before a const defined down here would be initialized.
function describe(holder: LockHolder): string {
  return holder.pid === null
    ? 'a session gone by now'
    : `pid ${holder.pid} (${holder.application || 'no application name'}, ${holder.state}, connected ${holder.since?.toISOString()})`
}
