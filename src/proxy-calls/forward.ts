/** One call to an upstream: no redirects followed, a time limit, and a cap on the response size. */
import { AppError, errors } from '../errors.ts'

export const upstreamTimeoutMs = 10_000
export const maxResponseBytes = 1024 * 1024

export interface UpstreamRequest {
  url: URL
  method: string
  headers: Record<string, string>
  body: string | undefined
}

export interface UpstreamResponse {
  status: number
  contentType: string | null
  /** Parsed when the upstream says JSON and it parses; text otherwise. */
  body: unknown
}

export async function forward(request: UpstreamRequest, timeoutMs = upstreamTimeoutMs): Promise<UpstreamResponse> {
  const signal = AbortSignal.timeout(timeoutMs)
  let response: Response
  try {
    response = await fetch(request.url, {
      method: request.method,
      headers: request.headers,
      body: request.body,
      redirect: 'manual',
      signal,
    })
  } catch {
    throw signal.aborted ? errors.upstreamTimeout() : errors.upstreamUnreachable()
  }
  const bytes = await readCapped(response, signal)
  const contentType = response.headers.get('content-type')
  const text = new TextDecoder().decode(bytes)
  let body: unknown = text
  if (contentType && /\bjson\b/i.test(contentType) && text.length > 0) {
    try {
      body = JSON.parse(text)
    } catch {
      // not the JSON it claimed to be: hand it over as text
    }
  }
  return { status: response.status, contentType, body }
}

async function readCapped(response: Response, signal: AbortSignal): Promise<Uint8Array> {
  const declared = Number(response.headers.get('content-length') ?? NaN)
  if (declared > maxResponseBytes) {
    await response.body?.cancel().catch(() => {})
    throw errors.upstreamTooLarge()
  }
  if (!response.body) return new Uint8Array()
  const reader = response.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      size += value.byteLength
      if (size > maxResponseBytes) {
        await reader.cancel().catch(() => {})
        throw errors.upstreamTooLarge()
      }
      chunks.push(value)
    }
  } catch (error) {
    if (signal.aborted) throw errors.upstreamTimeout()
    if (error instanceof AppError) throw error
    throw errors.upstreamUnreachable()
  }
  return Buffer.concat(chunks)
}
