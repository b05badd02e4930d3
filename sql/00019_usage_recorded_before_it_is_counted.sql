-- A proxy call's usage event was only a job on the metering queue until a worker counted it into
-- usage_events: a Redis that lost its data (a restart without its file, a failover to a replica
-- that lagged) lost calls that had reached their upstream, and nothing was billed for them. The
-- API now records each event here before it answers; counting moves it to usage_events (whose key
-- keeps it counted once) and adds it to its period. The queue only brings the count on sooner:
-- whatever it lost is counted by maintenance a minute later, and by the invoice run before it bills.
-- A table of its own, holding only what waits (usage_events stays written once per event).
create table usage_uncounted (
  id uuid primary key,
  subscription_id uuid not null,
  period_index integer not null,
  occurred_at timestamptz not null,
  foreign key (subscription_id, period_index) references subscription_periods (subscription_id, period_index)
);
create index usage_uncounted_by_time on usage_uncounted (occurred_at);
