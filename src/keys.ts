/** Every Redis key and channel name, built from one configurable prefix (tests use a random one). */

export type Keys = ReturnType<typeof createKeys>

export function createKeys(prefix: string) {
  return {
    prefix,
    rateLimit: (rule: string, subject: string) => `${prefix}rl:${rule}:${subject}`,
    inFlight: (rule: string, subject: string) => `${prefix}inflight:${rule}:${subject}`,
    // By the device code's SHA-256 (hex), never the code itself: a bearer secret (device-flow.ts).
    devicePoll: (codeHashHex: string) => `${prefix}device:poll:${codeHashHex}`,
    sseToken: (token: string) => `${prefix}sse:${token}`,
    // The identity provider's last key set fetched, for processes started while it cannot be reached.
    jwks: `${prefix}auth:jwks`,
    channels: {
      keyRevoked: `${prefix}auth:key-revoked`,
      inboxChanged: `${prefix}agent:inbox-changed`,
      events: `${prefix}events:published`,
      actorReplies: (processId: string) => `${prefix}actors:replies:${processId}`,
    },
    // Every key of one actor shares a hash tag, so in Redis Cluster an actor lives on one shard.
    actor: (actor: string) => ({
      mailbox: `${prefix}{actor:${actor}}:mailbox`,
      lease: `${prefix}{actor:${actor}}:lease`,
      fence: `${prefix}{actor:${actor}}:fence`,
      dead: `${prefix}{actor:${actor}}:dead`,
    }),
    // Which actors have mail to be looked at, and who marked each last: one hash tag, so one slot.
    actorsDue: `${prefix}{actors}:due`,
    actorsDueBy: `${prefix}{actors}:due-by`,
    actorsWake: `${prefix}{actors}:wake`,
    // By the Postgres the calls are recorded in (db.ts's identity): one restored from a backup, or a
    // replica promoted that lagged, lacks the calls recorded since, and its count starts anew.
    usage: (subscriptionId: string, periodIndex: number, database: string) => ({
      calls: `${prefix}usage:${subscriptionId}:${periodIndex}:${database}`,
    }),
    usageEvent: (eventId: string) => `${prefix}usage-event:${eventId}`,
    events: {
      user: (userId: string) => `${prefix}events:user:${userId}`,
      chat: `${prefix}events:chat`,
      openStreams: (subject: string) => `${prefix}events:open:${subject}`,
    },
    agent: (agentId: string) => ({
      // Pending conversations: user id -> entry; and the version each conversation was last written at.
      inbox: `${prefix}{actor:agent:${agentId}}:inbox`,
      versions: `${prefix}{actor:agent:${agentId}}:inbox-versions`,
      requests: `${prefix}{actor:agent:${agentId}}:requests`,
      // What it was built from: the Redis server's run id and the Postgres's identity (inbox.ts's builtMark).
      built: `${prefix}{actor:agent:${agentId}}:inbox-built`,
    }),
    bullPrefix: `${prefix}bull`,
    // Which deployment's database the prefix serves (redis-prefix.ts).
    deployment: `${prefix}deployment`,
  }
}
