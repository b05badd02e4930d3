/** Percentiles and the small number formats of the report. */

/** The p-quantile (0..1) of ascending values, nearest rank. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return 0
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))
  return sorted[rank]!
}

export function summarize(values: number[]): { p50: number; p99: number; max: number } {
  const sorted = Float64Array.from(values).sort()
  return { p50: percentile(sorted, 0.5), p99: percentile(sorted, 0.99), max: sorted[sorted.length - 1] ?? 0 }
}

export const ms = (value: number) => (value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2)) + ' ms'
export const mb = (value: number) => `${value.toFixed(0)} MB`
export const int = (value: number) => Math.round(value).toLocaleString('en-US')
export const pct = (value: number) => `${(value * 100).toFixed(0)} %`
