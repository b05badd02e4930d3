/** `bun run connections:reseal`: seals again with CONNECTIONS_KEY every credential CONNECTIONS_KEY_PREVIOUS sealed; prints the counts. */
import { loadConfig } from '../config.ts'
import { createSql } from '../db.ts'
import { reachDatabase } from '../reach-database.ts'
import { requireMigrated } from '../migrate.ts'
import { connectionKeys } from '../connections/credential-box.ts'
import { resealConnections } from '../connections/reseal.ts'
import { runCli } from './run.ts'

const usage =
  'usage: npm run connections:reseal (needs DATABASE_URL, CONNECTIONS_KEY, and CONNECTIONS_KEY_PREVIOUS during a rotation; ' +
  'safe to run while the service does, and again; exits 1 while a credential opens with neither key)'

await runCli('connections:reseal', usage, {}, async () => {
  const config = loadConfig(process.env)
  if (!config.databaseUrl) throw new Error('set DATABASE_URL')
  if (!config.connectionsKey) throw new Error('set CONNECTIONS_KEY (the key to seal with) and CONNECTIONS_KEY_PREVIOUS (the key being rotated out)')
  await reachDatabase(config.databaseUrl)
  const sql = createSql(config.databaseUrl, { max: 1 })
  try {
    await requireMigrated(sql)
    const { resealed, current, unreadable } = await resealConnections(sql, connectionKeys(config))
    console.log(`connections:reseal: ${resealed} sealed again with CONNECTIONS_KEY, ${current} already were, ${unreadable.length} unreadable`)
    if (unreadable.length > 0) {
      const shown = unreadable.slice(0, 20).join(', ') + (unreadable.length > 20 ? `, and ${unreadable.length - 20} more` : '')
      console.error(
        `connections:reseal: ${unreadable.length} connection${unreadable.length === 1 ? '' : 's'} open with neither CONNECTIONS_KEY nor ` +
          `CONNECTIONS_KEY_PREVIOUS (${shown}): give the key that sealed them as CONNECTIONS_KEY_PREVIOUS and run again, or, that key lost, ` +
          'their users must delete and add them again',
      )
      process.exitCode = 1
    }
  } finally {
    await sql.end()
  }
})
