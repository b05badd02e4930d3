/** Who is calling: a user (by JWT or user key) or an agent (by its key). */

export interface UserPrincipal {
  kind: 'user'
  userId: string
  /** The user key used, or null for a JWT. */
  keyId: string | null
}

export interface AgentPrincipal {
  kind: 'agent'
  participantId: string
  ownerId: string
  keyId: string
}

export type Principal = UserPrincipal | AgentPrincipal

/**
 * What a key's hash stands for: a live key's principal; `revoked` for a key issued and no longer
 * live (revoked, rotated out, or its agent deactivated); `unknown` for one never issued (made up).
 */
export type KeyStatus = Principal | 'revoked' | 'unknown'

/** The subject rate limits and idempotency records are kept per. */
export function principalSubject(principal: Principal): string {
  return principal.kind === 'user' ? `user:${principal.userId}` : `agent:${principal.participantId}`
}
