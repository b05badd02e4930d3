-- Which deployment a database belongs to: one id, drawn once, that a dump, a restore or a failover
-- keeps. Each process claims its REDIS_PREFIX for it at boot (src/redis-prefix.ts), so that two
-- deployments (staging and production on one Redis, say) never share mailboxes, queues and streams.
create table deployment (
  id uuid primary key default gen_random_uuid(),
  one boolean not null default true unique check (one)
);
insert into deployment default values;
