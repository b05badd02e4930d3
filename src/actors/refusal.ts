/** Turns an actor's refusal into the error a client sees. */
import { AppError, errors } from '../errors.ts'
import { isRefusal, type Refusal } from './types.ts'

const refusals: Record<string, () => AppError> = {
  not_found: () => errors.notFound(),
  expired: () => errors.notFound('Service request (expired)'),
  already_responded: () => errors.alreadyResponded(),
  idempotency_key_reused: () => errors.idempotencyKeyReused(),
  user_provided_precedence: () => errors.userProvidedPrecedence(),
  not_subscribed: () => errors.notSubscribed(),
  // The agent was deactivated (its key revoked) after its key was checked, before its command was applied.
  invalid_token: () => errors.invalidToken(),
  invalid_input: () => errors.validation('The request holds a value that cannot be stored'),
  // The target's open requests free up as it answers (or they expire), which no one can time.
  too_many_open_requests: () => errors.tooManyOpenRequests(60),
}

/** The result, or the matching AppError thrown for a refusal. */
export function accepted<Result>(result: Result | Refusal, notFound?: () => AppError): Result {
  if (!isRefusal(result)) return result
  if (result.refused === 'not_found' && notFound) throw notFound()
  throw (refusals[result.refused] ?? errors.internal)()
}
