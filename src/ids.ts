/**
 * Ids of rows written at a high rate (messages, service requests, usage events): UUIDv7, time-ordered
 * and increasing within this process, so their unique index grows at its right edge instead of
 * touching a random page of it with every insert. Still UUID strings, as the contract wants.
 */
export const newRowId = (): string => Bun.randomUUIDv7()
