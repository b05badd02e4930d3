/**
 * An independent model of what the contract (CONTRACT.md part 5) says is invoiced: plain arithmetic
 * over the subscriptions, calls, price changes, purchases and invoice runs a test made, sharing no
 * code with the service. test/billing-ledger.test.ts compares the service with it.
 */

export interface Terms {
  monthly: number
  included: number
  overage: number
}
export const dayMs = 86_400_000
const daysIn = (year: number, month: number) =>
  [31, year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month]!
/** Start of period k: k calendar months after the start, the day clamped to the month's length. */
export function periodStart(start: Date, k: number): Date {
  const months = start.getUTCFullYear() * 12 + start.getUTCMonth() + k
  const year = Math.floor(months / 12)
  const month = months - year * 12
  const day = Math.min(start.getUTCDate(), daysIn(year, month))
  return new Date(Date.UTC(year, month, day) + (start.getTime() % dayMs))
}
export function periodIndexOf(start: Date, at: Date): number {
  let k = 0
  while (periodStart(start, k + 1) <= at) k++
  return k
}

export interface ModelPlan {
  /** Every version of the terms, from when it was made. */
  versions: { from: Date; terms: Terms }[]
}
/**
 * Terms of period k. The contract: terms fixed at the period's start, a change from the subscriber's
 * next period. The service gives a rise notice (docs/architecture.md, "The invoice run"): a period
 * gets, term by term, the best for the subscriber of the terms in force from just before the
 * previous period began to just before it began (a drop from the next period, a rise a period later).
 */
export function termsOf(plan: ModelPlan, start: Date, k: number): Terms {
  const inForce = (at: Date, inclusive: boolean) =>
    [...plan.versions].reverse().find(v => (inclusive ? v.from <= at : v.from < at)) ?? plan.versions[0]!
  if (k === 0) return inForce(start, true).terms
  const previous = periodStart(start, k - 1)
  const begins = periodStart(start, k)
  const seen = [inForce(previous, false), ...plan.versions.filter(v => v.from >= previous && v.from < begins)].map(v => v.terms)
  return {
    monthly: Math.min(...seen.map(t => t.monthly)),
    included: Math.max(...seen.map(t => t.included)),
    overage: Math.min(...seen.map(t => t.overage)),
  }
}

export interface ModelSubscription {
  id: string
  user: number
  agent: number
  start: Date
  cancelledAt: Date | null
  calls: Date[]
}
export interface ModelPurchase {
  user: number
  agent: number
  configId: string
  price: number
  at: Date
}
export interface Line {
  kind: string
  quantity: number
  unitPriceCents: number
  amountCents: number
}
export interface ModelInvoice {
  user: number
  agent: number
  subscriptionId: string | null
  periodStart: string | null
  periodEnd: string | null
  lines: Line[]
  totalCents: number
  /** When it was issued: a run's time, or a purchase's. */
  issuedAt: string
}

/** What the contract says has been invoiced by `now`, the invoice runs having happened at `runs` (in order). */
export function expectedInvoices(plans: ModelPlan[], subscriptions: ModelSubscription[], purchases: ModelPurchase[], runs: Date[], now: Date) {
  const invoices: ModelInvoice[] = []
  for (const s of subscriptions) {
    const until = s.cancelledAt ?? now
    for (let k = 0; k === 0 || periodStart(s.start, k) <= until; k++) {
      const start = periodStart(s.start, k)
      const end = periodStart(s.start, k + 1)
      // in arrears, by the first run that finds it ended (a minute's settling included)
      const run = runs.find(at => at.getTime() - 60_000 >= end.getTime())
      if (!run) continue
      const terms = termsOf(plans[s.agent]!, s.start, k)
      const calls = s.calls.filter(at => at >= start && at < end).length
      const over = Math.max(0, calls - terms.included)
      const lines: Line[] = [{ kind: 'subscription', quantity: 1, unitPriceCents: terms.monthly, amountCents: terms.monthly }]
      if (over > 0) lines.push({ kind: 'overage', quantity: over, unitPriceCents: terms.overage, amountCents: over * terms.overage })
      const totalCents = lines.reduce((sum, line) => sum + line.amountCents, 0)
      invoices.push({
        user: s.user,
        agent: s.agent,
        subscriptionId: s.id,
        periodStart: start.toISOString(),
        periodEnd: end.toISOString(),
        lines,
        totalCents,
        issuedAt: run.toISOString(),
      })
    }
  }
  for (const p of purchases) {
    const lines = [{ kind: 'config_purchase', quantity: 1, unitPriceCents: p.price, amountCents: p.price }]
    invoices.push({
      user: p.user,
      agent: p.agent,
      subscriptionId: null,
      periodStart: null,
      periodEnd: null,
      lines,
      totalCents: p.price,
      issuedAt: p.at.toISOString(),
    })
  }
  return invoices
}
