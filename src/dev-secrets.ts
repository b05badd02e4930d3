/** Development secrets: generated once under DATA_DIR when nothing is configured outside production. */
import { readFileSync, writeFileSync, existsSync } from 'node:fs'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { makeDataDir, type Config } from './config.ts'

/**
 * Fills the JWT secret and the connections key from files under DATA_DIR when the environment
 * gives neither, creating them on first use. Production never gets here with gaps: loadConfig
 * refuses to boot.
 */
export function withDevSecrets(config: Config): Config {
  if (config.nodeEnv === 'production') return config
  const auth = { ...config.auth }
  if (!auth.jwtSecret && !auth.jwksUrl) auth.jwtSecret = readOrCreate(config.dataDir, 'dev-jwt-secret')
  const connectionsKey = config.connectionsKey ?? Buffer.from(readOrCreate(config.dataDir, 'dev-connections-key'), 'hex')
  return { ...config, auth, connectionsKey }
}

function readOrCreate(dir: string, name: string): string {
  const file = join(dir, name)
  if (existsSync(file)) return readFileSync(file, 'utf8').trim()
  makeDataDir(dir)
  const secret = randomBytes(32).toString('hex')
  try {
    writeFileSync(file, secret + '\n', { mode: 0o600, flag: 'wx' })
    return secret
  } catch {
    // Another process created it first: use theirs, so every process signs alike.
    return readFileSync(file, 'utf8').trim()
  }
}
