/** The service's app in this process (no HTTP server, no load generator) on a fresh migrated database. */
import { loadConfig } from '../../src/config.ts'
import { createDeps, type Deps } from '../../src/deps.ts'
import { createApp } from '../../src/app.ts'
import { createLog } from '../../src/log.ts'
import { createSql } from '../../src/db.ts'
import { migrate } from '../../src/migrate.ts'
import { createWorld, type World } from './world.ts'

export interface InProcess {
  world: World
  deps: Deps
  app: ReturnType<typeof createApp>
}

/** Runs `body` against the app, then closes it and drops the database and keys. */
export async function inProcess(body: (service: InProcess) => Promise<void>): Promise<void> {
  const world = await createWorld()
  try {
    const migrator = createSql(world.databaseUrl, { max: 1 })
    await migrate(migrator)
    await migrator.end()
    const deps = await createDeps(loadConfig(world.env), { log: createLog('warn') })
    try {
      await body({ world, deps, app: createApp(deps) })
    } finally {
      await deps.close()
    }
  } finally {
    await world.destroy()
  }
}
