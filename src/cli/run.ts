/** What every command-line tool shares: strict arguments, `--help`, and a failure as one line on stderr. */
import { parseArgs, type ParseArgsConfig } from 'node:util'
import { firstLine } from '../text.ts'

/** A wrong use of the tool (a bad option or value): exit 2. */
export class UsageError extends Error {}

type Options = NonNullable<ParseArgsConfig['options']>

/**
 * Parses the arguments (an unknown option, a missing value or a stray word is a wrong use), answers
 * `--help` with the usage, and runs `main`. A failure ends the process with one line, `name: why`:
 * exit 2 for a wrong use, 1 for anything else (an unreachable database, a bad setting). `main` sets `process.exitCode` itself for an outcome that is not a failure.
 *
 * @example
 * await runCli('migrate', 'usage: npm run migrate', {}, async () => { ... })
 */
export async function runCli<O extends Options>(
  name: string,
  usage: string,
  options: O,
  main: (values: ReturnType<typeof parseArgs<{ options: O }>>['values']) => Promise<void>,
): Promise<void> {
  let values
  try {
    const parsed = parseArgs({ options: { ...options, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false })
    if ((parsed.values as { help?: boolean }).help) {
      console.log(usage)
      return
    }
    // Needed, though the lint calls it unnecessary: parseArgs types the spread options apart from `O`.
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-assertion
    values = parsed.values as ReturnType<typeof parseArgs<{ options: O }>>['values']
  } catch (error) {
    return fail(name, `${firstLine(error)} (--help shows the usage)`, 2)
  }
  try {
    await main(values)
  } catch (error) {
    if (error instanceof UsageError) fail(name, error.message, 2)
    else fail(name, firstLine(error), 1)
  }
}

function fail(name: string, message: string, code: number) {
  console.error(`${name}: ${message}`)
  process.exitCode = code
}
