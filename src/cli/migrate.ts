/** `bun run migrate`: applies pending migrations to DATABASE_URL and prints what it applied. */
import { loadConfig } from '../config.ts'
import { createSql } from '../db.ts'
import { migrate } from '../migrate.ts'

const config = loadConfig(process.env)
if (!config.databaseUrl) {
  console.error('migrate: set DATABASE_URL (the embedded database is migrated by `bun run start` itself)')
  process.exit(1)
}
const sql = createSql(config.databaseUrl, { max: 1 })
try {
  const applied = await migrate(sql, undefined, config.migrationTimeouts)
  console.log(applied.length === 0 ? 'migrate: up to date' : `migrate: applied ${applied.join(', ')}`)
} catch (error) {
  console.error(`migrate: ${error instanceof Error ? error.message : String(error)}`)
  process.exitCode = 1
} finally {
  await sql.end()
}
