/** The auth plugin: route options `user`, `agent`, `caller` and `viewer` resolve the principal. */
import { Elysia } from 'elysia'
import { errors } from '../errors.ts'
import type { Authenticator } from './authenticator.ts'

type Security = Record<string, string[]>[]
const bearer: Security = [{ bearer: [] }]
const agentKey: Security = [{ apiKey: [] }, { bearer: [] }]
const anyCredential: Security = [{ bearer: [] }, { apiKey: [] }]
// Either header is read when sent (and must then be valid), so both are named beside the empty one.
const optionalCredential: Security = [{}, { bearer: [] }, { apiKey: [] }]

/**
 * @example
 * new Elysia().use(auth).get('/v1/auth/me', ({ user }) => user.userId, { user: true })
 */
export function authPlugin(authenticator: Authenticator) {
  return new Elysia({ name: 'auth' }).macro({
    /** A user (JWT or sk_usr_ key); an agent key is 403. */
    user: {
      detail: { security: bearer },
      async resolve({ request, server }) {
        const principal = await authenticator.authenticate(request, server)
        if (!principal) throw errors.unauthorized()
        if (principal.kind !== 'user') throw errors.userOnly()
        return { user: principal }
      },
    },
    /** An agent, by X-API-Key or Bearer sk_agt_; a user credential is 403. */
    agent: {
      detail: { security: agentKey },
      async resolve({ request, server }) {
        const principal = await authenticator.authenticate(request, server, 'agent')
        if (!principal) throw errors.unauthorized()
        if (principal.kind !== 'agent') throw errors.agentOnly()
        return { agent: principal }
      },
    },
    /** A user or an agent. */
    caller: {
      detail: { security: anyCredential },
      async resolve({ request, server }) {
        const principal = await authenticator.authenticate(request, server)
        if (!principal) throw errors.unauthorized()
        return { caller: principal }
      },
    },
    /** Public, but a credential, when sent, must be valid and shows more (e.g. to an owner). */
    viewer: {
      detail: { security: optionalCredential },
      async resolve({ request, server }) {
        return { viewer: await authenticator.authenticate(request, server) }
      },
    },
  })
}

export type AuthPlugin = ReturnType<typeof authPlugin>
