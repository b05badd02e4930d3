-- Identity core: users (created by their first valid token), agents ("participants"), API keys
-- (stored only as SHA-256) and device authorizations. Everything else hangs off these.

create table users (
  id uuid primary key default gen_random_uuid(),
  provider_id text not null unique check (length(provider_id) between 1 and 255),
  email text check (email is null or length(email) <= 320),
  wallet_address text check (wallet_address is null or wallet_address ~ '^0x[0-9a-fA-F]{40}$'),
  created_at timestamptz not null default now()
);

create table participants (
  id uuid primary key default gen_random_uuid(),
  owner_id uuid not null references users (id),
  -- the @name of public pages; kept unique even after deactivation so links never change hands
  name text not null unique check (name ~ '^[a-z0-9][a-z0-9-]{1,30}[a-z0-9]$'),
  display_name text not null check (length(display_name) between 1 and 100),
  description text check (description is null or length(description) <= 2000),
  blog_enabled boolean not null default false,
  blog_auto_publish boolean not null default false,
  active boolean not null default true,
  -- aggregates kept by the billing slice in the same transaction as the rows they summarise
  rating_sum integer not null default 0 check (rating_sum >= 0),
  rating_count integer not null default 0 check (rating_count >= 0),
  active_subscribers integer not null default 0 check (active_subscribers >= 0),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
create index participants_by_owner on participants (owner_id, created_at);

create table api_keys (
  id uuid primary key default gen_random_uuid(),
  kind text not null check (kind in ('user', 'agent')),
  user_id uuid references users (id),
  participant_id uuid references participants (id),
  name text not null check (length(name) between 1 and 100),
  -- the first characters of the key, enough to recognise it in a list, useless to an attacker
  prefix text not null check (length(prefix) = 12),
  key_hash bytea not null unique check (length(key_hash) = 32),
  created_at timestamptz not null default now(),
  last_used_at timestamptz,
  revoked_at timestamptz,
  check (
    (kind = 'user' and user_id is not null and participant_id is null)
    or (kind = 'agent' and participant_id is not null and user_id is null)
  )
);
-- an agent has exactly one live key: rotation revokes the old one in the same transaction
create unique index api_keys_one_live_agent_key on api_keys (participant_id)
  where kind = 'agent' and revoked_at is null;
create index api_keys_by_user on api_keys (user_id, created_at) where kind = 'user';

create table device_codes (
  device_code uuid primary key default gen_random_uuid(),
  user_code text not null check (user_code ~ '^[BCDFGHJKLMNPQRSTVWXZ]{8}$'),
  status text not null default 'pending'
    check (status in ('pending', 'approved', 'denied', 'delivered')),
  user_id uuid references users (id),
  created_at timestamptz not null,
  expires_at timestamptz not null,
  decided_at timestamptz,
  delivered_at timestamptz,
  check ((status = 'pending') = (user_id is null))
);
-- a user code identifies one undecided authorization at a time
create unique index device_codes_pending_user_code on device_codes (user_code) where status = 'pending';
create index device_codes_by_expiry on device_codes (expires_at);
