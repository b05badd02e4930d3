/** HTTP calls to the API processes, each attempt recorded with its outcome; a process that refuses connections is skipped for a moment. */

export type AttemptKind = 'setup' | 'poll' | 'sign-in' | 'message' | 'reply' | 'proxy' | 'subscription' | 'service-request' | 'service-respond'

export interface Attempt {
  kind: AttemptKind
  /** The Idempotency-Key sent, if any. */
  key?: string
  /** Which API process (its index in the URL list) it went to. */
  api: number
  startedAt: number
  endedAt: number
  /** Absent when no answer came (connection refused or reset, or no answer within the timeout). */
  status?: number
  error?: string
  body?: any
  retryAfterS?: number
}

export interface CallOptions {
  token?: string
  apiKey?: string
  body?: unknown
  key?: string
  /** Send to this API process rather than the next in turn. */
  api?: number
}

export interface Client {
  apiCount: number
  call(kind: AttemptKind, method: string, path: string, options?: CallOptions): Promise<Attempt>
  /** Every attempt made, in the order they ended. */
  attempts: Attempt[]
}

const timeoutMs = 15_000
const skipDownMs = 300

export function createClient(apiUrls: string[]): Client {
  const attempts: Attempt[] = []
  const downUntil = apiUrls.map(() => 0)
  let turn = 0

  const pick = () => {
    for (let i = 0; i < apiUrls.length; i++) {
      const api = turn++ % apiUrls.length
      if (downUntil[api]! <= Date.now()) return api
    }
    return turn++ % apiUrls.length
  }

  return {
    apiCount: apiUrls.length,
    attempts,
    async call(kind, method, path, options = {}) {
      const api = options.api ?? pick()
      const headers: Record<string, string> = {}
      if (options.token) headers.authorization = `Bearer ${options.token}`
      if (options.apiKey) headers['x-api-key'] = options.apiKey
      if (options.key) headers['idempotency-key'] = options.key
      if (options.body !== undefined) headers['content-type'] = 'application/json'
      const attempt: Attempt = { kind, key: options.key, api, startedAt: Date.now(), endedAt: 0 }
      try {
        const response = await fetch(`${apiUrls[api]}${path}`, {
          method,
          headers,
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
          signal: AbortSignal.timeout(timeoutMs),
        })
        const text = await response.text()
        attempt.status = response.status
        try {
          attempt.body = JSON.parse(text)
        } catch {
          attempt.body = text
        }
        const retryAfter = Number(response.headers.get('retry-after'))
        if (Number.isFinite(retryAfter) && retryAfter > 0) attempt.retryAfterS = retryAfter
      } catch (error) {
        const e = error as Error & { code?: string }
        // Bun's messages repeat the code and add advice: the code says it.
        attempt.error = e.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : (e.code ?? `${e.name}: ${e.message}`)
        if (e.name !== 'TimeoutError') downUntil[api] = Date.now() + skipDownMs
      }
      attempt.endedAt = Date.now()
      attempts.push(attempt)
      return attempt
    },
  }
}

/** The attempt as one line for a report. */
export function describeAttempt(attempt: Attempt, since: number): string {
  const answer = attempt.status !== undefined ? `${attempt.status}${attempt.body?.error ? ` ${attempt.body.error}` : ''}` : attempt.error
  return `api-${attempt.api + 1} at +${attempt.startedAt - since} ms → ${answer} after ${attempt.endedAt - attempt.startedAt} ms`
}
