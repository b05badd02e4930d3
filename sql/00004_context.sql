-- Shared knowledge: one organization per user, and its typed context entries. Entries are
-- append-only: every write is a new version (1, 2, 3 ... per type and key, written by the
-- organization's actor), the newest is found by the primary key, and a trigger refuses any update
-- or delete, so history can never be rewritten.

create table organizations (
  id uuid primary key default gen_random_uuid(),
  user_id uuid not null unique references users (id),
  created_at timestamptz not null
);

create table context_entries (
  org_id uuid not null references organizations (id),
  type text not null check (type in (
    'brand', 'audience', 'tone', 'products', 'competitors', 'keywords', 'goals', 'preferences',
    'team', 'content_insights', 'custom'
  )),
  key text not null check (key ~ '^[A-Za-z0-9_.:-]{1,100}$'),
  version integer not null check (version >= 1),
  data jsonb not null check (jsonb_typeof(data) = 'object' and octet_length(data::text) <= 65536 * 2),
  confidence text not null check (confidence in ('user_provided', 'derived', 'suggested')),
  source jsonb check (source is null or jsonb_typeof(source) = 'object'),
  author_kind text not null check (author_kind in ('agent', 'user')),
  author_id uuid not null,
  created_at timestamptz not null,
  primary key (org_id, type, key, version)
);

create function context_entries_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'context entries are append-only';
end
$$;

create trigger context_entries_append_only
  before update or delete on context_entries
  for each row execute function context_entries_append_only();
