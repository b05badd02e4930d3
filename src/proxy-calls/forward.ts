/** One call to an upstream: no redirects followed, a time limit, and a cap on the response size. */
import { AppError, errors } from '../errors.ts'

export const upstreamTimeoutMs = 10_000
export const maxResponseBytes = 1024 * 1024

/**
 * The upstream answered, then its answer failed us (not HTTP, its body cut off, or a Content-Encoding
 * that does not decode): it had the call, so the call counts. Still 502 `upstream_unreachable` to the client.
 */
export class UpstreamAnswerFailed extends AppError {
  constructor() {
    super(502, 'upstream_unreachable', 'The upstream’s answer broke off or could not be decoded')
  }
}

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
  } catch (error) {
    if (signal.aborted) throw errors.upstreamTimeout()
    // An answer, but not HTTP: the upstream had the request all the same.
    if (malformedAnswer(error)) throw new UpstreamAnswerFailed()
    throw errors.upstreamUnreachable()
  }
  // No body follows these (RFC 9110, 6.4.1): their Content-Length is the size of one that would.
  const bodiless = request.method === 'HEAD' || response.status === 204 || response.status === 304
  const bytes = bodiless ? await noBody(response) : await readCapped(response, signal)
  const contentType = response.headers.get('content-type')
  const text = decoderFor(contentType).decode(bytes)
  let body: unknown = text
  if (contentType && /\bjson\b/i.test(contentType) && text.length > 0) {
    try {
      const parsed: unknown = JSON.parse(text)
      // Nested past what can be written back out without exhausting the stack (a hostile or broken
      // upstream), or holding a number past a double's range (written back out as null): handed over
      // as text, as JSON that does not parse is.
      if (!unwritable(parsed, maxParsedDepth)) body = parsed
    } catch {
      // not the JSON it claimed to be: hand it over as text
    }
  }
  return { status: response.status, contentType, body }
}

/** A decoder for the charset the Content-Type names; UTF-8 when it names none, or one not known here. */
function decoderFor(contentType: string | null): TextDecoder {
  const charset = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(contentType ?? '')?.[1]
  try {
    // Any WHATWG label (Bun's types list fewer); an unknown one throws.
    return new TextDecoder((charset ?? 'utf-8') as ConstructorParameters<typeof TextDecoder>[0])
  } catch {
    return new TextDecoder()
  }
}

/** How deep an upstream's JSON may nest and still be handed over parsed (far past any real API's). */
export const maxParsedDepth = 512

/**
 * Whether `value` nests objects and arrays more than `limit` deep, or holds a number JSON.parse made
 * infinite (`1e400`); looks no deeper than `limit`.
 */
function unwritable(value: unknown, limit: number): boolean {
  if (typeof value === 'number') return !Number.isFinite(value)
  if (value === null || typeof value !== 'object') return false
  if (limit === 0) return true
  for (const child of Array.isArray(value) ? value : Object.values(value)) {
    if (unwritable(child, limit - 1)) return true
  }
  return false
}

/**
 * What Bun's fetch throws when the upstream answered something that is not an HTTP response (a
 * status line or header it cannot read, Content-Lengths that disagree or are not numbers).
 */
const malformedCodes = new Set(['Malformed_HTTP_Response', 'InvalidContentLength'])
function malformedAnswer(error: unknown): boolean {
  return error instanceof Error && malformedCodes.has((error as Error & { code?: unknown }).code as string)
}

async function noBody(response: Response): Promise<Uint8Array> {
  await response.body?.cancel().catch(() => {})
  return new Uint8Array()
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
    throw new UpstreamAnswerFailed()
  }
  return Buffer.concat(chunks)
}
