-- Marketplace billing: plans, subscriptions with their per-period terms, reviews, config listings and
-- purchases, and idempotency records. Invariants live here as unique keys and checks, so concurrent
-- duplicates cannot slip in whatever the application does.

create table plans (
  id uuid primary key default gen_random_uuid(),
  participant_id uuid not null references participants (id),
  name text not null check (length(name) between 1 and 100),
  description text check (description is null or length(description) <= 1000),
  monthly_price_cents integer not null check (monthly_price_cents between 0 and 10000000),
  included_proxy_calls integer not null check (included_proxy_calls between 0 and 10000000),
  overage_per_call_cents integer not null check (overage_per_call_cents between 0 and 100000),
  active boolean not null default true,
  created_at timestamptz not null,
  updated_at timestamptz not null
);
create index plans_by_participant on plans (participant_id, created_at);

-- Every price a plan has had, from when it took effect: a period's terms are those in force at the
-- period's start, so a price change reaches a subscriber only from their next period.
create table plan_terms (
  plan_id uuid not null references plans (id),
  effective_from timestamptz not null,
  monthly_price_cents integer not null check (monthly_price_cents between 0 and 10000000),
  included_proxy_calls integer not null check (included_proxy_calls between 0 and 10000000),
  overage_per_call_cents integer not null check (overage_per_call_cents between 0 and 100000),
  primary key (plan_id, effective_from)
);

create table subscriptions (
  id uuid primary key default gen_random_uuid(),
  user_id uuid not null references users (id),
  participant_id uuid not null references participants (id),
  plan_id uuid not null references plans (id),
  status text not null check (status in ('active', 'cancelled')),
  -- period k runs from started_at + k months to started_at + k+1 months (Postgres clamps the day of
  -- month, as the application does); the current one follows from the clock, nothing to keep in step
  started_at timestamptz not null,
  cancelled_at timestamptz,
  created_at timestamptz not null,
  check ((status = 'cancelled') = (cancelled_at is not null))
);
-- one active subscription per user and agent
create unique index subscriptions_one_active on subscriptions (user_id, participant_id) where status = 'active';
create index subscriptions_by_user on subscriptions (user_id, created_at desc, id desc);
create index subscriptions_by_participant on subscriptions (participant_id) where status = 'active';

-- The periods of a subscription that have begun, each with the terms in force at its start and the
-- proxy calls counted in it. Rows appear at subscribe, on the first metered call of a period, or
-- when the invoice run reaches the period, whichever comes first.
create table subscription_periods (
  subscription_id uuid not null references subscriptions (id),
  period_index integer not null check (period_index >= 0),
  period_start timestamptz not null,
  period_end timestamptz not null,
  monthly_price_cents integer not null check (monthly_price_cents between 0 and 10000000),
  included_proxy_calls integer not null check (included_proxy_calls between 0 and 10000000),
  overage_per_call_cents integer not null check (overage_per_call_cents between 0 and 100000),
  proxy_calls integer not null default 0 check (proxy_calls >= 0),
  primary key (subscription_id, period_index),
  check (period_end > period_start)
);

create table reviews (
  id uuid primary key default gen_random_uuid(),
  participant_id uuid not null references participants (id),
  user_id uuid not null references users (id),
  rating smallint not null check (rating between 1 and 5),
  comment text check (comment is null or length(comment) <= 1000),
  created_at timestamptz not null,
  updated_at timestamptz not null,
  unique (participant_id, user_id)
);
create index reviews_by_participant on reviews (participant_id, created_at desc, id desc);

create table config_listings (
  id uuid primary key default gen_random_uuid(),
  participant_id uuid not null references participants (id),
  name text not null check (length(name) between 1 and 100),
  description text check (description is null or length(description) <= 1000),
  price_cents integer not null check (price_cents between 0 and 10000000),
  file_type text not null check (file_type ~ '^[A-Za-z0-9._-]{1,64}$'),
  content text not null check (length(content) <= 1000000),
  preview_snippet text check (preview_snippet is null or length(preview_snippet) <= 500),
  active boolean not null default true,
  created_at timestamptz not null,
  updated_at timestamptz not null
);
create index config_listings_by_participant on config_listings (participant_id, created_at);

create table config_purchases (
  id uuid primary key default gen_random_uuid(),
  config_id uuid not null references config_listings (id),
  user_id uuid not null references users (id),
  -- what was paid, whatever the listing costs later
  price_cents integer not null check (price_cents between 0 and 10000000),
  -- the purchase's invoice, issued by the usage-billing slice
  invoice_id uuid,
  purchased_at timestamptz not null,
  unique (config_id, user_id)
);
create index config_purchases_by_user on config_purchases (user_id, purchased_at desc);

-- Idempotency-Key records: a replay returns exactly what the first call did and nothing happens
-- twice. For effects in Postgres the response is stored in the effect's transaction; for commands
-- applied by actors the key is reserved first (response_status null) and completed after.
create table idempotency_keys (
  subject text not null,
  key text not null check (length(key) between 1 and 255),
  request_hash bytea not null,
  response_status integer,
  -- JSON text, not jsonb: a proxied upstream body may hold what jsonb refuses (\u0000)
  response_body text,
  created_at timestamptz not null,
  primary key (subject, key),
  check ((response_status is null) = (response_body is null))
);
create index idempotency_keys_by_age on idempotency_keys (created_at);
