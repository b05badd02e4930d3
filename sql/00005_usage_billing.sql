-- Usage billing: users' connected accounts (credentials encrypted by the application), the usage
-- events of proxy calls (one row per call that reached the upstream: the primary key makes double
-- counting impossible), usage thresholds reached, and invoices with gap-free sequential numbers.

create table connections (
  id uuid primary key default gen_random_uuid(),
  user_id uuid not null references users (id),
  provider text not null check (provider ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
  base_url text not null check (length(base_url) <= 2048),
  label text check (label is null or length(label) <= 100),
  -- AES-256-GCM: 12-byte nonce, 16-byte tag, then the ciphertext; the plaintext never reaches the database
  credential bytea not null check (length(credential) > 28),
  created_at timestamptz not null,
  unique (user_id, provider)
);

create table usage_events (
  id uuid primary key,
  subscription_id uuid not null references subscriptions (id),
  period_index integer not null,
  occurred_at timestamptz not null,
  counted_at timestamptz not null,
  foreign key (subscription_id, period_index) references subscription_periods (subscription_id, period_index)
);
create index usage_events_by_subscription on usage_events (subscription_id, occurred_at);

-- 80 % and 100 % of a period's included calls, each recorded once, for the owner and the subscriber
create table usage_thresholds (
  subscription_id uuid not null,
  period_index integer not null,
  percent integer not null check (percent in (80, 100)),
  reached_at timestamptz not null,
  primary key (subscription_id, period_index, percent),
  foreign key (subscription_id, period_index) references subscription_periods (subscription_id, period_index)
);

-- One row: the next invoice number. Taking numbers locks it until commit, so numbers have no gaps.
create table invoice_counter (
  id boolean primary key default true check (id),
  next_number bigint not null check (next_number >= 1)
);
insert into invoice_counter (next_number) values (1);

create table invoices (
  id uuid primary key default gen_random_uuid(),
  number bigint not null unique check (number >= 1),
  user_id uuid not null references users (id),
  participant_id uuid not null references participants (id),
  subscription_id uuid references subscriptions (id),
  period_index integer,
  period_start timestamptz,
  period_end timestamptz,
  purchase_id uuid unique references config_purchases (id),
  total_cents bigint not null check (total_cents >= 0),
  status text not null default 'issued' check (status = 'issued'),
  issued_at timestamptz not null,
  -- one invoice per (subscription, period), never two
  unique (subscription_id, period_index),
  check ((subscription_id is null) = (purchase_id is not null)),
  check ((subscription_id is null) = (period_index is null))
);
create index invoices_by_user on invoices (user_id, issued_at desc, number desc);
create index invoices_by_participant on invoices (participant_id, issued_at);

create table invoice_lines (
  invoice_id uuid not null references invoices (id),
  line_number integer not null check (line_number >= 1),
  kind text not null check (kind in ('subscription', 'overage', 'config_purchase')),
  description text not null,
  quantity bigint not null check (quantity >= 0),
  unit_price_cents bigint not null check (unit_price_cents >= 0),
  amount_cents bigint not null check (amount_cents = quantity * unit_price_cents),
  primary key (invoice_id, line_number)
);

alter table subscription_periods add column invoice_id uuid references invoices (id);
create index subscription_periods_uninvoiced on subscription_periods (period_end) where invoice_id is null;
alter table config_purchases add foreign key (invoice_id) references invoices (id);
