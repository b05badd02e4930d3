/** Billing periods: whole calendar months counted from the subscription's start, day clamped. */

/**
 * The anchor moved by whole months, the day clamped to the target month's length (UTC).
 *
 * @example
 * addMonths(new Date('2026-01-31T10:00:00Z'), 1) // 2026-02-28T10:00:00Z
 * addMonths(new Date('2026-01-31T10:00:00Z'), 2) // 2026-03-31T10:00:00Z (anchored, not chained)
 */
export function addMonths(anchor: Date, months: number): Date {
  const total = anchor.getUTCMonth() + months
  const year = anchor.getUTCFullYear() + Math.floor(total / 12)
  const month = ((total % 12) + 12) % 12
  const lastDay = new Date(Date.UTC(year, month + 1, 0)).getUTCDate()
  return new Date(
    Date.UTC(
      year,
      month,
      Math.min(anchor.getUTCDate(), lastDay),
      anchor.getUTCHours(),
      anchor.getUTCMinutes(),
      anchor.getUTCSeconds(),
      anchor.getUTCMilliseconds(),
    ),
  )
}

export function periodBounds(startedAt: Date, index: number): { start: Date; end: Date } {
  return { start: addMonths(startedAt, index), end: addMonths(startedAt, index + 1) }
}

/** The first instant of the calendar month (UTC) that holds `at`. */
export function monthStart(at: Date): Date {
  return new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth(), 1))
}

/** The index of the period that holds `at` (0 for anything before the start). */
export function periodIndexAt(startedAt: Date, at: Date): number {
  const months = (at.getUTCFullYear() - startedAt.getUTCFullYear()) * 12 + at.getUTCMonth() - startedAt.getUTCMonth()
  let index = Math.max(0, months - 1)
  while (addMonths(startedAt, index + 1) <= at) index++
  return index
}
