/** GET /v1/billing/invoices: the caller's invoices, newest first. */
import { Elysia, t } from 'elysia'
import type { Sql } from '../db.ts'
import { BeforeParam, failures, iso, isoOrNull, Ok, ok, pageLimit, parseBefore, Query } from '../http/schema.ts'
import type { AuthPlugin } from '../auth/plugin.ts'
import { Invoice } from './schema.ts'
import { listInvoices } from './store.ts'

const listLimit = pageLimit(50, 100)

/** What the invoice routes use. */
export interface RouteDeps {
  sql: Sql
}

export function invoiceRoutes({ sql }: RouteDeps, auth: AuthPlugin) {
  return new Elysia({ tags: ['billing'] }).use(auth).get(
    '/v1/billing/invoices',
    async ({ user, query }) => {
      const page = { limit: listLimit.parse(query.limit), before: parseBefore(query.before, '/before') }
      const rows = await listInvoices(sql, user.userId, page)
      return ok(
        rows.map(row => ({
          id: row.id,
          number: row.number,
          participantId: row.participantId,
          subscriptionId: row.subscriptionId,
          periodStart: isoOrNull(row.periodStart),
          periodEnd: isoOrNull(row.periodEnd),
          lines: row.lines,
          totalCents: row.totalCents,
          status: row.status,
          issuedAt: iso(row.issuedAt),
        })),
      )
    },
    {
      user: true,
      query: Query({ limit: listLimit.param, before: BeforeParam }),
      response: { 200: Ok(t.Array(Invoice)), ...failures(400, 401, 403) },
      detail: {
        operationId: 'listInvoices',
        summary: 'Invoices you were issued, newest first (default 50, max 100)',
        description:
          'Needs a user credential; lists the invoices the caller pays. Pages with `limit` and `before` (invoices issued ' +
          'strictly before that time); no two of a payer’s invoices share an `issuedAt` (those issued together are a ' +
          'millisecond apart), so a page never ends among invoices the next would skip. Subscription periods are ' +
          'invoiced by a worker after they end, config purchases at once. Invoices are issued, not charged.',
      },
    },
  )
}
