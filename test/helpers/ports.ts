/** Spare TCP ports on 127.0.0.1, taken from the kernel so no two runs share one. */
import { createServer } from 'node:net'

export async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const address = server.address()
  await new Promise(resolve => server.close(resolve))
  if (address === null || typeof address === 'string') throw new Error('no spare port')
  return address.port
}
