/**
 * Ids of rows written at a high rate (messages, service requests, usage events): UUIDv7, time-ordered
 * and increasing within this process, so their unique index grows at its right edge instead of
 * touching a random page of it with every insert. Still UUID strings, as the contract wants.
 * Invoices get theirs the same way from Postgres (`uuid_v7()`, sql/00017).
 */
export const newRowId = (): string => Bun.randomUUIDv7()

/**
 * The row id every repeat of one request gets (an Idempotency-Key's reservation): a UUIDv7 of `at`
 * whose other 74 bits are the first ones of `seed` (at least 19 hex digits, e.g. a SHA-256).
 */
export function rowIdFor(at: Date, seed: string): string {
  if (!/^[0-9a-f]{19}/.test(seed)) throw new Error('rowIdFor needs a seed of at least 19 hex digits')
  const time = at.getTime().toString(16).padStart(12, '0')
  const variant = ((parseInt(seed[3]!, 16) & 0x3) | 0x8).toString(16)
  const hex = `${time}7${seed.slice(0, 3)}${variant}${seed.slice(4, 19)}`
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`
}
