-- The invoice run's batches, each recorded in the transaction that issues it: the range of invoice
-- numbers it took (numbers come from the counter, locked until commit, so a batch's are contiguous
-- and its own) and when their `invoice.issued` events went out. A worker that dies between a batch's
-- commit and its events leaves the batch unannounced; the maintenance run announces it later, so an
-- issued invoice is always announced, at least once. `claimed_until` keeps two sweeps off one batch.
create table invoice_batches (
  id bigserial primary key,
  first_number bigint not null,
  last_number bigint not null check (last_number >= first_number),
  created_at timestamptz not null default now(),
  claimed_until timestamptz,
  announced_at timestamptz
);
create index invoice_batches_unannounced on invoice_batches (created_at) where announced_at is null;
