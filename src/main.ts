/** Boot: configuration, database (embedded when none is configured), migrations, API and/or workers, drain on SIGTERM. */
import { ConfigError, loadConfig } from './config.ts'
import { withDevSecrets } from './dev-secrets.ts'
import { captureConsole, createLog, errorFields, stdoutFlushed, toStderr } from './log.ts'
import { createSql } from './db.ts'
import { reachDatabase } from './reach-database.ts'
import { migrate } from './migrate.ts'
import { holdRedisPrefix } from './redis-prefix.ts'
import { createDeps, replySettings, requestSettings, type Deps } from './deps.ts'
import { createApp } from './app.ts'
import { serverOptions } from './http/server-options.ts'
import type { EmbeddedDatabase } from './embedded-postgres.ts'
import { startWorkers, type Workers } from '../workers/index.ts'
import { metricsTokens, serveMetrics } from './metrics/routes.ts'
import { firstLine } from './text.ts'

type Role = 'all' | 'api' | 'workers'

// Set by a signal during the boot, which ends the process itself: a step that fails after it (the
// embedded database it stops, a migration it cuts) is the stop's doing, not a boot that failed.
let bootInterrupted = false

const role: Role = process.argv.includes('--api') ? 'api' : process.argv.includes('--workers') ? 'workers' : 'all'

async function main() {
  let config = withDevSecrets(loadConfig(process.env))
  const log = createLog(config.logLevel)
  captureConsole(log)
  // A promise nobody awaited that failed (a library's, during an outage say) is logged; Bun would
  // otherwise print it as text and end the process, turning a blip of Redis into a restart.
  process.on('unhandledRejection', error => log.error('unhandled rejection', errorFields(error)))
  // Bun's warnings (a deprecation, too many listeners) as records; the start scripts run Bun with
  // --no-warnings, which stops it printing them as text on stderr.
  process.on('warning', warning => log.warn('process warning', { name: warning.name, error: warning.message }))
  if (config.nodeEnv === 'production' && config.auth.jwksUrl && !config.auth.audience) {
    log.warn('AUTH_AUDIENCE is not set: JWTs the identity provider signed for any of its applications are accepted')
  }

  // A signal during the boot (migrations waiting for their lock, say) ends the process at once, but
  // not before the embedded database, once started, is stopped: killed by the signal, Bun left it
  // running, and every later start failed on its postmaster.pid. Nothing was served, so there is
  // nothing to drain: a stop asked for and done exits 0 (a service manager would call 1 a failure);
  // a database that did not stop within 5 s, 1.
  let embeddedStarting: Promise<EmbeddedDatabase> | undefined
  let drain: ((signal: string) => void) | undefined
  const onSignal = (signal: string) => {
    if (drain) return drain(signal)
    bootInterrupted = true
    log.warn(`${signal} during the boot; exiting`)
    const stopped = (embeddedStarting?.then(database => database.stop()) ?? Promise.resolve()).then(
      () => 0,
      () => 1,
    )
    void Promise.race([stopped, Bun.sleep(5000).then(() => 1)]).then(exitFlushed)
  }
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(signal, () => onSignal(signal))

  // Else the metrics would take the port first, and the API's failure to listen would blame PORT.
  if (role !== 'workers' && config.metrics.port === config.port) {
    throw new ConfigError(`invalid METRICS_PORT: must differ from PORT (${config.port}), where the API listens`)
  }
  let embedded: EmbeddedDatabase | undefined
  if (!config.databaseUrl) {
    if (role !== 'all') throw new ConfigError(`start:${role} needs DATABASE_URL; the embedded database serves only \`start\``)
    // Loaded only when used: the embedded-postgres package hooks SIGTERM on import (see that module).
    const { startEmbeddedPostgres } = await import('./embedded-postgres.ts')
    embedded = await (embeddedStarting = startEmbeddedPostgres(config.dataDir, log))
    config = { ...config, databaseUrl: embedded.url }
  }

  let deps: Deps | undefined
  let workers: Workers | undefined
  let server: ReturnType<ReturnType<typeof createApp>['listen']> | undefined
  let metricsServer: ReturnType<typeof serveMetrics> | undefined
  try {
    // With the startup parameters this role's pools send: a pooler that refuses one stops the boot here.
    const settings = role === 'workers' ? requestSettings : replySettings
    await reachDatabase(config.databaseUrl!, { statementTimeoutMs: config.statementTimeoutMs, lockTimeoutMs: config.lockTimeoutMs, settings })
    const migrator = createSql(config.databaseUrl!, { max: 1 })
    try {
      const applied = await migrate(migrator, undefined, config.migrationTimeouts, {
        waiting: holder => log.warn('waiting for the migration lock, held by another session', { ...holder }),
        ahead: names =>
          log.warn('the database has migrations this code does not: running on its schema as it is (sql/README.md)', { migrations: names }),
      })
      if (applied.length > 0) log.info('migrations applied', { applied })
    } finally {
      await migrator.end()
    }

    deps = await createDeps(config, { log })
    await holdRedisPrefix(deps.sql, deps.redis, deps.keys, log)
    // First, so that a process that answers on its API port is already scraped.
    if (config.metrics.port !== undefined) {
      metricsServer = onPort('METRICS_PORT', config.metrics.port, () =>
        serveMetrics(deps!.metrics, { port: config.metrics.port!, tokens: metricsTokens(config.metrics) }),
      )
      log.info('metrics listening', { port: metricsServer.port })
    }
    if (role !== 'api') workers = await startWorkers(deps)
    // Last: a signal before the boot's end exits without a drain, so nothing may be served before it.
    if (role !== 'workers') {
      server = onPort('PORT', config.port, () =>
        createApp(deps!).listen({ port: config.port, idleTimeout: config.httpIdleTimeoutS, ...serverOptions(deps!.log) }),
      )
      log.info('api listening', { port: server.server?.port, swagger: `${config.siteUrl}/swagger` })
    }
  } catch (error) {
    // The workers hand their actors on (the API's port taken, say, after they started).
    await workers?.close().catch(() => {})
    await metricsServer?.stop(true)
    await deps?.close().catch(() => {})
    await embedded?.stop().catch(() => {})
    throw error
  }

  let force: ReturnType<typeof setTimeout> | undefined
  // One stop of the embedded database (if any), shared by the drain and an abort that cuts it short.
  let databaseStopped: Promise<void> | undefined
  const stopDatabase = () => (databaseStopped ??= embedded ? embedded.stop() : Promise.resolve())
  /** Ends the process without draining, once the embedded database has stopped or 5 s have passed. */
  const abort = (reason: string, fields: Record<string, unknown> = {}) => {
    clearTimeout(force)
    log.error(reason, fields)
    void Promise.race([stopDatabase().catch(() => {}), Bun.sleep(5000)]).finally(() => exitFlushed(1))
  }
  // The signal that began the shutdown, and when (undefined: serving).
  let stopping: { signal: string; at: number } | undefined
  const shutdown = async (signal: string) => {
    if (stopping) {
      // The same signal within a second is the same stop delivered twice (a process group signalled,
      // as systemd's default KillMode does: Bun gets it, and npm passes it on), not Ctrl-C again.
      if (signal === stopping.signal && performance.now() - stopping.at < 1000) return
      // A second signal (Ctrl-C again) will not wait for the drain.
      return abort(`${signal} while shutting down; exiting without waiting`)
    }
    stopping = { signal, at: performance.now() }
    log.info('shutting down', { signal })
    deps?.lifecycle.drain()
    force = setTimeout(() => abort('shutdown timed out; exiting'), config.shutdownTimeoutMs)
    try {
      // Serve on, not ready, while load balancers notice (SHUTDOWN_DELAY_MS); end event streams (their
      // clients reconnect elsewhere: ended before the delay, they came back here and held the drain
      // open); stop accepting, let open requests finish, then stop the workers and the connections.
      if (server && config.shutdownDelayMs > 0) await Bun.sleep(config.shutdownDelayMs)
      deps?.events.closeAll()
      await server?.stop()
      await workers?.close()
      await metricsServer?.stop(true)
      await deps?.close()
      await stopDatabase()
      clearTimeout(force)
      log.info('stopped')
      exitFlushed(0)
    } catch (error) {
      abort('shutdown failed', errorFields(error))
    }
  }
  // SIGTERM and SIGINT drain; so does SIGHUP (a closed terminal, an ssh session ended), which Bun's
  // default would answer by dying mid-request, the embedded PostgreSQL left running: nothing reloads.
  drain = signal => void shutdown(signal)
  // Bun starts its HTTP client's thread at a process's first fetch and ends the whole process when
  // that thread finds no file descriptor (docs/limits.md): start it now, not at a JWKS fetch or a
  // proxy call made while a flood of connections holds every descriptor. The thread starts with the
  // call; its answer is not waited for.
  if (server) void fetch(`http://127.0.0.1:${server.server?.port ?? config.port}/health/live`).catch(() => {})
}

/** Exits once stdout has written out the log it holds (at most 1 s): process.exit alone drops it. */
function exitFlushed(code: number): void {
  void stdoutFlushed(1000).finally(() => process.exit(code))
}

/** Listens, or throws one line naming the variable that chose the port (Bun's own names only the port). */
function onPort<T>(variable: string, port: number, listen: () => T): T {
  try {
    return listen()
  } catch (error) {
    throw new Error(`cannot listen on ${variable}=${port}: ${firstLine(error)}`)
  }
}

// What ends the process (a boot that cannot finish; a library that emits an error nobody listens to,
// such as a child process that cannot start) is one JSON line on stderr, its message's first line,
// and a non-zero exit. A crash's stack is kept in the line: it is the only trace of where it was.
const fatal = createLog('error', toStderr)

process.on('uncaughtException', error => {
  fatal.error('uncaught exception', { error: firstLine(error), stack: error instanceof Error ? error.stack : undefined })
  exitFlushed(1)
})

main().catch(error => {
  if (bootInterrupted) return
  fatal.error('boot failed', { error: firstLine(error) })
  exitFlushed(1)
})
