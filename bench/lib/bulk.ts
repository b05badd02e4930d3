/** Bulk seeding inside one transaction: foreign-key checks skipped where the role may, since the seeding makes the rows consistent itself. */
import type { Db } from '../../src/db.ts'

/**
 * Turns off the per-row foreign-key triggers for the rest of the transaction (session_replication_role,
 * superusers only: the bench's default role is postgres); a role that may not just keeps them. The
 * service's own statements in the run still check every key.
 */
export async function skipForeignKeyChecks(tx: Db): Promise<void> {
  const [role] = await tx<{ superuser: boolean }[]>`select rolsuper as superuser from pg_roles where rolname = current_user`
  if (role?.superuser) await tx`set local session_replication_role = replica`
}
