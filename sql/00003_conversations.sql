-- Actors and the agent HTTP API: the record of applied actor commands (idempotency by command id),
-- conversations between subscribers and agents, and agent-to-agent service requests.

-- Every command an actor applied, written in the same transaction as its effect, so a command
-- delivered twice (after a runtime died before acknowledging it) is applied once. `result` is what
-- the asker is answered, again, on a repeat; `request_hash` catches an Idempotency-Key reused with
-- another request.
create table actor_applied (
  actor text not null,
  command_id text not null,
  -- the mailbox entry that carried it: only a redelivery of that same entry may project it again
  entry_id text not null,
  request_hash bytea,
  result jsonb not null,
  applied_at timestamptz not null,
  primary key (actor, command_id)
);
create index actor_applied_by_age on actor_applied (applied_at);

-- The fencing token of the runtime that last applied a command of each actor: a holder whose lease
-- ran out (a long pause) is refused here, inside the transaction, once another has taken over. Also
-- the time of the last command, so an actor's clock never runs backwards across runtimes.
create table actor_fences (
  actor text primary key,
  token bigint not null,
  last_at timestamptz not null
);

create table messages (
  -- apply order: an agent's commands are applied one at a time, so seq orders its messages
  seq bigserial primary key,
  id uuid not null unique,
  participant_id uuid not null references participants (id),
  user_id uuid not null references users (id),
  role text not null check (role in ('user', 'agent')),
  text text not null check (length(text) between 1 and 10000),
  created_at timestamptz not null
);
create index messages_by_conversation on messages (participant_id, user_id, created_at desc, seq desc);

-- One row per (agent, user): the pending state the agent's Redis inbox is rebuilt from.
create table conversations (
  participant_id uuid not null references participants (id),
  user_id uuid not null references users (id),
  latest_user_message text,
  latest_user_message_at timestamptz,
  latest_reply_at timestamptz,
  pending_count integer not null default 0 check (pending_count >= 0),
  primary key (participant_id, user_id)
);
create index conversations_pending on conversations (participant_id) where pending_count > 0;

create table service_requests (
  id uuid primary key,
  from_participant_id uuid not null references participants (id),
  target_participant_id uuid not null references participants (id),
  service_tag text check (service_tag is null or length(service_tag) between 1 and 100),
  input text not null check (length(input) <= 50000),
  status text not null default 'pending' check (status in ('pending', 'completed', 'failed', 'expired')),
  output text check (output is null or length(output) <= 100000),
  success boolean,
  created_at timestamptz not null,
  expires_at timestamptz not null,
  responded_at timestamptz,
  check ((status in ('completed', 'failed')) = (responded_at is not null))
);
create index service_requests_open on service_requests (target_participant_id, created_at) where status = 'pending';
create index service_requests_expiring on service_requests (expires_at) where status = 'pending';
