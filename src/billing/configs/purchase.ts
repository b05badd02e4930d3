/** Buying a config: once per user, at the listing's price as read in the purchase's transaction, invoiced and told. */
import type { Db } from '../../db.ts'
import { errors } from '../../errors.ts'
import { issuePurchaseInvoice } from '../invoice-numbers.ts'
import { enqueueEvents } from '../../events/outbox.ts'
import { findConfig, findPurchase, insertPurchase, type PurchaseRow } from './store.ts'

/**
 * The user's purchase of the config, made now (`created`) or found from before; the invoice and the
 * owner's and buyer's events are written in the same transaction (`tx`). 404 for no such config (or
 * its agent deactivated), 409 when it is off sale or its price is not `expectedPriceCents`, 403 for
 * the owner's own. A purchase made before is answered whatever became of the listing or its agent
 * since: the buyer keeps it (GET /my-configs), and one retrying a purchase whose answer it lost must
 * not read that it has none.
 */
export async function buyConfig(
  tx: Db,
  purchase: { configId: string; userId: string; expectedPriceCents: number | undefined; at: Date },
): Promise<{ created: boolean; row: PurchaseRow }> {
  const { userId, expectedPriceCents, at } = purchase
  const config = await findConfig(tx, purchase.configId, userId, { holdAgent: true })
  const bought = await findPurchase(tx, purchase.configId, userId)
  if (bought) return { created: false, row: bought }
  if (!config) throw errors.notFound('Config')
  if (config.ownerId === userId) throw errors.cannotBuyOwnConfig()
  if (!config.active) throw errors.configInactive()
  // Checked against the price read in this transaction, which is the price charged.
  if (expectedPriceCents !== undefined && expectedPriceCents !== config.priceCents) throw errors.priceChanged(config.priceCents)
  const created = await insertPurchase(tx, { configId: config.id, userId, priceCents: config.priceCents }, at)
  if (created) {
    const { participantId, priceCents } = config
    const invoiceId = await issuePurchaseInvoice(tx, { purchaseId: created, userId, participantId, configName: config.name, priceCents, at })
    const sale = { purchaseId: created, configId: config.id, participantId, userId, priceCents }
    await enqueueEvents(tx, at, [
      { userId: config.ownerId, type: 'config.purchased', payload: sale },
      { userId, type: 'invoice.issued', payload: { invoiceId, totalCents: priceCents } },
    ])
  }
  return { created: created !== undefined, row: (await findPurchase(tx, config.id, userId))! }
}
