/** Every Redis key and channel name, built from one configurable prefix (tests use a random one). */

export type Keys = ReturnType<typeof createKeys>

export function createKeys(prefix: string) {
  return {
    prefix,
    rateLimit: (rule: string, subject: string) => `${prefix}rl:${rule}:${subject}`,
    devicePoll: (deviceCode: string) => `${prefix}device:poll:${deviceCode}`,
    sseToken: (token: string) => `${prefix}sse:${token}`,
    channels: {
      keyRevoked: `${prefix}auth:key-revoked`,
    },
    bullPrefix: `${prefix}bull`,
  }
}
