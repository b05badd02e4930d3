-- migrate: no-transaction lock-timeout=0 statement-timeout=0
-- The invoice run takes ended periods 5,000 at a time in (period_end, subscription_id, period_index)
-- order. The partial index on period_end alone gave only the first of those, so each batch sorted
-- every period still due: periods that end together (a month's subscriptions turning at once) made
-- each batch a sort of all of them, on disk past work_mem, and the run quadratic (a million periods
-- did not finish in 18 minutes). Indexed in the run's order, a batch reads its 5,000 and stops.
drop index concurrently if exists subscription_periods_due;
create index concurrently subscription_periods_due on subscription_periods (period_end, subscription_id, period_index) where invoice_id is null;
drop index concurrently if exists subscription_periods_uninvoiced;
