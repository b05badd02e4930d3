-- A proxy call's usage event was only a job on the metering queue until a worker counted it into
-- usage_events: a Redis that lost its data (a restart without its file, a failover to a replica
-- that lagged) lost calls that had reached their upstream, and nothing was billed for them. The
-- API now records each event here before it answers, uncounted (counted_at null); the queue only
-- brings the count on sooner. Whatever the queue lost is counted by maintenance a minute later, and
-- the invoice run counts what is left before it bills a period.
alter table usage_events alter column counted_at drop not null;
create index usage_events_uncounted on usage_events (occurred_at) where counted_at is null;
